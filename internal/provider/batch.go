package provider

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Batch clients speak the providers' Batch APIs (OpenAI's /v1/files and
// /v1/batches, Azure's at /openai/..., Anthropic's /v1/messages/batches)
// with the configuration of the synchronous client they come from
// (OpenAI.Batches, Azure.Batches, Anthropic.Batches): its base URL, key
// and transport. Like Client, they never retry.

// BatchLine is one request of a batch: the custom id its result comes back
// under, and an OpenAI chat-completions (or embeddings) body, as Call.Body.
type BatchLine struct {
	CustomID string
	Body     []byte
}

// BatchRequest is one batch to submit: one model, one endpoint.
type BatchRequest struct {
	// Model is the model the lines are for: Anthropic's params and Azure's
	// lines name it (Azure: the global-batch deployment); OpenAI's lines
	// are sent as they are.
	Model string
	// Endpoint is "" or job.EndpointChat for chat completions,
	// job.EndpointEmbeddings for embeddings (OpenAI-compatible only).
	Endpoint string
	Lines    []BatchLine
	// Key, when set, is sent as the batch's metadata (OpenAI's
	// metadata.sluice_batch; Anthropic's batches have none), so that a
	// create whose answer was lost can be found again (BatchFinder).
	Key string
}

// BatchFinder finds the batch created with a BatchRequest.Key: OpenAI's
// and Azure's clients, by listing the batches (the newest 100) and reading
// their metadata. ok is false when none of them has the key.
type BatchFinder interface {
	Find(ctx context.Context, key string) (b Batch, ok bool, err error)
}

// MetadataKey is the metadata member that carries BatchRequest.Key.
const MetadataKey = "sluice_batch"

// BatchState is where a batch is, in both providers' terms.
type BatchState int

const (
	// BatchRunning: validating, in_progress or finalizing (OpenAI),
	// in_progress (Anthropic).
	BatchRunning BatchState = iota
	// BatchCancelling: a cancel was asked for and has not finished; lines
	// may still complete.
	BatchCancelling
	// BatchEnded: completed, expired or cancelled (OpenAI), ended
	// (Anthropic). Its results can be fetched and will not change.
	BatchEnded
	// BatchFailed: OpenAI refused the batch when validating it; no line
	// ran. Batch.Err says why.
	BatchFailed
)

func (s BatchState) String() string {
	switch s {
	case BatchRunning:
		return "running"
	case BatchCancelling:
		return "cancelling"
	case BatchEnded:
		return "ended"
	case BatchFailed:
		return "failed"
	}
	return fmt.Sprintf("batch_state_%d", int(s))
}

// Batch is a batch's state as its provider last reported it.
type Batch struct {
	ID     string
	State  BatchState
	Status string // the provider's own word: in_progress, cancelling, ended...
	// Total is the number of lines, Done how many the provider reports
	// answered (OpenAI counts as it goes; Anthropic only once the batch
	// ended).
	Total, Done int
	// Err is set when State is BatchFailed: a *BatchError.
	Err error

	outputFile, errorFile, resultsURL string
}

// LineResult is what became of one line.
type LineResult int

const (
	// LineSucceeded: the provider answered 2xx; Body and Usage hold the
	// answer. The provider billed it.
	LineSucceeded LineResult = iota
	// LineErrored: the provider answered with an error, classified in
	// Outcome as the same answer to a synchronous call would be.
	LineErrored
	// LineExpired: the batch's window ended before the line ran.
	LineExpired
	// LineCancelled: the batch was cancelled before the line ran.
	LineCancelled
)

func (r LineResult) String() string {
	switch r {
	case LineSucceeded:
		return "succeeded"
	case LineErrored:
		return "errored"
	case LineExpired:
		return "expired"
	case LineCancelled:
		return "cancelled"
	}
	return fmt.Sprintf("line_result_%d", int(r))
}

// BatchResult is one line's result, mapped back by its custom id.
type BatchResult struct {
	CustomID string
	Result   LineResult
	// Body is, for LineSucceeded, an OpenAI chat.completion (or
	// embeddings list; Anthropic's message converted) and, for
	// LineErrored, the provider's error in OpenAI's shape.
	Body  []byte
	Usage job.Usage
	// Outcome classifies a LineErrored answer (Classify); for the others
	// its Class is Success (succeeded) or Unknown.
	Outcome Outcome
}

// BatchClient submits, follows, reads and cancels batches of one provider.
// Every method makes one or a few HTTP calls and never retries; an error is
// a *TransportError (with the Phase of the call that failed: a Submit whose
// create call failed in PhaseAwaitHeaders may have created the batch), a
// *BatchHTTPError (the provider refused), or ErrBatchTooLarge / a
// *BatchLineError (refused before sending).
type BatchClient interface {
	Submit(ctx context.Context, req BatchRequest) (Batch, error)
	Status(ctx context.Context, id string) (Batch, error)
	// Results fetches an ended batch's results. A line in none of them
	// was not run (OpenAI leaves cancelled lines out of its files).
	Results(ctx context.Context, id string) ([]BatchResult, error)
	// Cancel asks for the batch to be cancelled and returns at once,
	// the batch usually BatchCancelling; see CancelAndWait.
	Cancel(ctx context.Context, id string) (Batch, error)
}

// BatchesOf returns the batch client of a synchronous client (an *OpenAI,
// *Azure or *Anthropic), with its configuration, and whether it has one.
func BatchesOf(c Client, lim BatchLimits) (BatchClient, bool) {
	b, ok := c.(interface{ Batches(BatchLimits) BatchClient })
	if !ok {
		return nil, false
	}
	return b.Batches(lim), true
}

// BatchLimits bound one batch. Zero fields take the provider's.
type BatchLimits struct {
	MaxRequests int
	MaxBytes    int64
	// MaxLineBytes bounds one result line read back (default 64 MiB).
	MaxLineBytes int
}

// The providers' limits on one batch.
const (
	OpenAIBatchMaxRequests    = 50_000
	OpenAIBatchMaxBytes       = 200 << 20
	AnthropicBatchMaxRequests = 100_000
	AnthropicBatchMaxBytes    = 256 << 20
	defaultMaxLineBytes       = 64 << 20
)

func (l BatchLimits) withDefaults(requests int, bytes int64) BatchLimits {
	if l.MaxRequests <= 0 {
		l.MaxRequests = requests
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = bytes
	}
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = defaultMaxLineBytes
	}
	return l
}

// Batch errors, checked with errors.Is.
var (
	// ErrEnqueuedTokenLimit: OpenAI failed the batch because the model's
	// enqueued tokens would pass its limit (token_limit_exceeded). Nothing
	// ran; the same lines may be submitted again once batches end.
	ErrEnqueuedTokenLimit = errors.New("the model's enqueued-token limit for batches is reached")
	// ErrBatchQueueFull: Anthropic refused the batch because its requests
	// would pass the processing-queue limit (a 429). Nothing was created.
	ErrBatchQueueFull = errors.New("the batch processing queue is full")
	// ErrBatchTooLarge: the batch has more lines or bytes than one batch
	// may (refused before sending, or by the provider).
	ErrBatchTooLarge = errors.New("the batch exceeds the provider's per-batch limits")
	// ErrBatchNotEnded: Results was asked for a batch still running.
	ErrBatchNotEnded = errors.New("the batch has not ended")
)

// BatchError is why a provider failed a batch (OpenAI's errors.data[0]).
type BatchError struct {
	Code, Message string
	Line          int // 1-based input line, 0 when none
}

func (e *BatchError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("batch failed: %s (line %d): %s", e.Code, e.Line, e.Message)
	}
	return "batch failed: " + e.Code + ": " + e.Message
}

// Is matches ErrEnqueuedTokenLimit and ErrBatchTooLarge by code.
func (e *BatchError) Is(target error) bool {
	switch target {
	case ErrEnqueuedTokenLimit:
		return e.Code == "token_limit_exceeded"
	case ErrBatchTooLarge:
		return e.Code == "too_many_tasks" || e.Code == "file_too_large"
	}
	return false
}

// BatchHTTPError is a provider's refusal of a batch call, classified as a
// synchronous call's answer would be.
type BatchHTTPError struct {
	Op      string // "upload", "create", "status", "cancel", "results"
	Outcome Outcome
	// queueFull and tooLarge mark Anthropic's 429 on create and 413.
	queueFull, tooLarge bool
}

func (e *BatchHTTPError) Error() string {
	return fmt.Sprintf("batch %s: HTTP %d %s: %s", e.Op, e.Outcome.HTTPStatus, e.Outcome.Code, e.Outcome.Message)
}

// Is matches ErrBatchQueueFull and ErrBatchTooLarge.
func (e *BatchHTTPError) Is(target error) bool {
	return (target == ErrBatchQueueFull && e.queueFull) || (target == ErrBatchTooLarge && e.tooLarge)
}

// BatchLineError is a line refused before sending (a body the Anthropic
// adapter cannot convert, a custom id the provider would refuse).
type BatchLineError struct {
	CustomID string
	Err      error
}

func (e *BatchLineError) Error() string { return "batch line " + e.CustomID + ": " + e.Err.Error() }
func (e *BatchLineError) Unwrap() error { return e.Err }

// CancelAndWait cancels a batch and polls it every poll until the
// cancellation has finished (BatchEnded, or BatchFailed), so the lines
// that completed meanwhile are known before anything else runs them. A
// batch that already ended is returned as it is.
func CancelAndWait(ctx context.Context, c BatchClient, id string, poll time.Duration) (Batch, error) {
	b, err := c.Cancel(ctx, id)
	if err != nil {
		// An ended batch cannot be cancelled: its status says so.
		var he *BatchHTTPError
		if !errors.As(err, &he) || he.Outcome.HTTPStatus < 400 || he.Outcome.HTTPStatus >= 500 {
			return Batch{}, err
		}
		if b, err = c.Status(ctx, id); err != nil {
			return Batch{}, err
		}
	}
	t := time.NewTimer(poll)
	defer t.Stop()
	for b.State == BatchRunning || b.State == BatchCancelling {
		t.Reset(poll)
		select {
		case <-ctx.Done():
			return b, ctx.Err()
		case <-t.C:
		}
		if b, err = c.Status(ctx, id); err != nil {
			return Batch{}, err
		}
	}
	return b, nil
}

// batchHTTP is the transport side both batch clients share.
type batchHTTP struct {
	rt      http.RoundTripper
	maxResp int
}

// call makes one request and reads the answer in full; a non-2xx answer is
// a *BatchHTTPError for op.
func (h batchHTTP) call(ctx context.Context, op, method, target string, body []byte, hdr http.Header) ([]byte, error) {
	resp, err := openMethod(ctx, h.rt, method, target, body, hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := readBody(ctx, resp, h.maxResp)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &BatchHTTPError{Op: op, Outcome: Classify(&Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil, time.Now())}
	}
	return b, nil
}

// lines streams a JSONL answer to each, one line at a time.
func (h batchHTTP) lines(ctx context.Context, op, target string, hdr http.Header, maxLine int, each func([]byte) error) error {
	resp, err := openMethod(ctx, h.rt, http.MethodGet, target, nil, hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes))
		return &BatchHTTPError{Op: op, Outcome: Classify(&Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil, time.Now())}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := each(sc.Bytes()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return transportErr(ctx, PhaseBody, err)
	}
	return nil
}

// lineOutcome classifies an errored line's answer as a synchronous call's.
func lineOutcome(status int, body []byte) Outcome {
	return Classify(&Response{Status: status, Header: http.Header{}, Body: body}, nil, time.Now())
}
