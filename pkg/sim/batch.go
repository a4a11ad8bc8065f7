package sim

import (
	"slices"
	"sync"
	"time"
)

// The Batch APIs: OpenAI's (POST /v1/files with purpose batch, /v1/batches;
// batch_openai.go) and Anthropic's Message Batches (/v1/messages/batches;
// batch_anthropic.go), served under every profile. They share one engine:
//
//   - a batch's lines finish one after another, evenly spread over
//     BatchConfig.Duration from its creation (line i of n at
//     created + Duration·(i+1)/n); each is answered when it finishes as
//     the same synchronous call would be (the same parsing, errors, output
//     length and usage), but never rate-limited: batch work is not charged
//     to a model's RPM/TPM and does not show in Stats;
//   - a cancelled batch finishes the line in progress (the next one due,
//     at most Duration/n away) and cancels the rest; the lines already
//     answered stay answered;
//   - lines not answered BatchConfig.Expiry after creation expire;
//   - OpenAI's enqueued-token limit (BatchConfig.EnqueuedTokens, per
//     model) counts the prompt tokens of the model's batches not yet
//     ended; a batch over it fails with token_limit_exceeded. Anthropic's
//     processing queue (BatchConfig.QueueRequests, all models) counts the
//     unanswered requests of batches not yet ended; a batch over it is
//     refused with a 429;
//   - every line that ends is written to a ledger ([Server.BatchLines]):
//     its custom_id, outcome and, when it succeeded, the tokens billed.
//
// Progress is computed from the clock (Config.Now) whenever a batch is
// read: no goroutine runs a batch, and a test with a fake clock moves
// batches forward by moving the clock.

// Provider limits on one batch.
const (
	OpenAIBatchMaxRequests    = 50_000
	OpenAIBatchMaxBytes       = 200 << 20
	AnthropicBatchMaxRequests = 100_000
	AnthropicBatchMaxBytes    = 256 << 20
	// DefaultBatchExpiry is both providers' completion window.
	DefaultBatchExpiry = 24 * time.Hour
)

// BatchConfig shapes the Batch APIs.
type BatchConfig struct {
	// Duration is how long a batch takes: its lines finish evenly over it
	// (default 0: every line is answered by the first read).
	Duration time.Duration
	// Expiry ends a batch this long after its creation, its unanswered
	// lines expired (default DefaultBatchExpiry).
	Expiry time.Duration
	// EnqueuedTokens is OpenAI's enqueued-token limit: the prompt tokens
	// of a model's batches not yet ended (0 = unlimited).
	EnqueuedTokens int64
	// QueueRequests is Anthropic's processing-queue limit: requests not
	// yet answered in batches not yet ended, all models (0 = unlimited).
	QueueRequests int
	// MaxRequests and MaxBytes override both providers' per-batch limits
	// (0: OpenAI 50,000 requests and 200 MB, Anthropic 100,000 and 256 MB).
	MaxRequests int
	MaxBytes    int64
}

func (c BatchConfig) maxRequests(provider int) int {
	if c.MaxRequests > 0 {
		return c.MaxRequests
	}
	return provider
}

func (c BatchConfig) maxBytes(provider int64) int64 {
	if c.MaxBytes > 0 {
		return c.MaxBytes
	}
	return provider
}

// BatchLine is the ledger's record of one batch line that ended.
type BatchLine struct {
	API      string `json:"api"` // "openai" or "anthropic"
	BatchID  string `json:"batch_id"`
	CustomID string `json:"custom_id"`
	Model    string `json:"model"`
	// Result is succeeded, errored, expired or canceled.
	Result string `json:"result"`
	// InputTokens and OutputTokens are what the line was billed: its usage
	// when it succeeded, 0 otherwise (the providers bill neither errors,
	// expired nor cancelled lines).
	InputTokens  int       `json:"input_tokens"`
	OutputTokens int       `json:"output_tokens"`
	At           time.Time `json:"at"`
}

// Line results.
const (
	lineSucceeded = "succeeded"
	lineErrored   = "errored"
	lineExpired   = "expired"
	lineCanceled  = "canceled"
)

// simLine is one line of a batch.
type simLine struct {
	customID string
	body     []byte // the request body (OpenAI's body, Anthropic's params)
	due      int64  // when it finishes, unix ns
	result   string // "" while pending
	status   int    // the answer's HTTP status (succeeded: 2xx)
	answer   []byte // the answer's body
	at       int64  // when it ended
}

// simBatch is one batch of either API.
type simBatch struct {
	id, api, model, endpoint string
	created, expires         int64
	cancelAt, cancelEnd      int64  // 0: not cancelled
	ended                    int64  // 0: not ended
	endedAs                  string // "" (completed), canceled or expired
	finalize                 int64  // OpenAI: finalizing until then
	tokens                   int64  // OpenAI: enqueued prompt tokens
	failure                  *batchFailure
	lines                    []*simLine
	inputFile                string
	outputFile, errorFile    string // set when it ended
	metadata                 any
	// answer answers a line when it finishes; onEnd, if set, runs when
	// the batch ends.
	answer func(l *simLine, at int64)
	onEnd  func(b *simBatch)
}

// batchFailure is why an OpenAI batch failed validation.
type batchFailure struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// simFile is an OpenAI file.
type simFile struct {
	id, name, purpose string
	created           int64
	data              []byte
}

// batchState is both Batch APIs' state within a generation.
type batchState struct {
	mu      sync.Mutex
	files   map[string]*simFile
	batches map[string]*simBatch
	ledger  []BatchLine
}

func newBatchState() *batchState {
	return &batchState{files: map[string]*simFile{}, batches: map[string]*simBatch{}}
}

// schedule spreads n lines over d from created.
func schedule(lines []*simLine, created int64, d time.Duration) {
	n := int64(len(lines))
	for i, l := range lines {
		l.due = created + int64(d)*(int64(i)+1)/max(n, 1)
	}
}

// advance brings b to now: answers the lines due, then ends it by
// cancellation, expiry or completion. The caller holds st.mu.
func (st *batchState) advance(b *simBatch, now int64) {
	if b.ended != 0 || b.failure != nil {
		return
	}
	limit := now
	if b.cancelAt != 0 {
		limit = min(now, b.cancelEnd)
	}
	limit = min(limit, b.expires)
	pending := 0
	for _, l := range b.lines {
		if l.result != "" {
			continue
		}
		if l.due <= limit {
			b.answer(l, l.due)
			st.record(b, l)
			continue
		}
		pending++
	}
	switch {
	case b.cancelAt != 0 && now >= b.cancelEnd:
		st.end(b, b.cancelEnd, lineCanceled)
	case now >= b.expires && pending > 0:
		st.end(b, b.expires, lineExpired)
	case pending == 0 && b.cancelAt == 0:
		last := b.created
		for _, l := range b.lines {
			last = max(last, l.due)
		}
		if now >= b.finalizeAfter(last) {
			st.end(b, b.finalizeAfter(last), "")
		}
	}
}

// finalizeAfter is when a batch whose last line finished at last ends:
// OpenAI finalizes for a tenth of the batch's duration.
func (b *simBatch) finalizeAfter(last int64) int64 {
	return last + b.finalize
}

// end ends b at t, the pending lines taking result.
func (st *batchState) end(b *simBatch, t int64, result string) {
	for _, l := range b.lines {
		if l.result == "" {
			l.result, l.at = result, t
			st.record(b, l)
		}
	}
	b.ended, b.endedAs = t, result
	if b.onEnd != nil {
		b.onEnd(b)
	}
}

// record writes an ended line to the ledger.
func (st *batchState) record(b *simBatch, l *simLine) {
	e := BatchLine{API: b.api, BatchID: b.id, CustomID: l.customID, Model: b.model, Result: l.result, At: time.Unix(0, l.at)}
	if l.result == lineSucceeded {
		e.InputTokens, e.OutputTokens = usageOf(b.api, l.answer)
	}
	if e.Model == "" {
		e.Model = modelOf(l.body)
	}
	st.ledger = append(st.ledger, e)
}

// cancel starts cancelling b at now: the line in progress (the next one
// due, at most one line's share of the duration away) still finishes.
func (st *batchState) cancel(b *simBatch, now int64, d time.Duration) {
	st.advance(b, now)
	if b.ended != 0 || b.cancelAt != 0 || b.failure != nil {
		return
	}
	b.cancelAt, b.cancelEnd = now, now
	next := int64(-1)
	for _, l := range b.lines {
		if l.result == "" && (next < 0 || l.due < next) {
			next = l.due
		}
	}
	if next >= 0 {
		b.cancelEnd = min(next, now+int64(d)/int64(max(len(b.lines), 1)))
	}
}

// counts tallies b's lines by result ("" for pending).
func (b *simBatch) counts() map[string]int {
	c := map[string]int{}
	for _, l := range b.lines {
		c[l.result]++
	}
	return c
}

// BatchLines returns the ledger of both Batch APIs: every line that ended
// since the start (or Reset), in the order they ended. Reading it brings
// every batch up to the clock.
func (s *Server) BatchLines() []BatchLine {
	st := s.batch.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.now()
	ids := make([]string, 0, len(st.batches))
	for id := range st.batches {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		st.advance(st.batches[id], now)
	}
	return slices.Clone(st.ledger)
}
