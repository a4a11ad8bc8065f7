package provider

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
)

// MaxBodyBytes caps how much of a provider response body is read when the
// client's MaxResponseBytes is 0. A larger
// body is a PhaseBody transport error (code "body_too_large").
const MaxBodyBytes = 16 << 20

// DefaultConnectTimeout bounds dialing plus the TLS handshake when a config
// leaves ConnectTimeout zero.
const DefaultConnectTimeout = 10 * time.Second

// Call is one provider request.
type Call struct {
	Provider string // configured provider name, for labels
	Model    string // the Anthropic adapter uses it as the model when set; the OpenAI client forwards Body untouched
	// Endpoint is the API the body is for: "" or job.EndpointChat for chat
	// completions, job.EndpointEmbeddings for embeddings (OpenAI-compatible
	// providers only: Anthropic has no embeddings API).
	Endpoint string
	// Body is an OpenAI chat-completions (or embeddings) JSON body. The
	// OpenAI client forwards it as-is; the Anthropic client converts a chat
	// body to a Messages API body.
	Body []byte
	// IdempotencyKey is sent as the Idempotency-Key header when non-empty.
	IdempotencyKey string
	// JobID is sent as the X-Sluice-Job-Id header when non-empty.
	JobID string
	// SendBy, when set, is the latest instant the request may start to
	// leave: a paced call planned for an instant must reach the provider
	// within its tolerance, or the plan no longer bounds what the provider
	// sees. It is checked when the request's first byte is about to be
	// written, after the connection was obtained (dialing, or waiting for
	// one, can take longer than the tolerance on a loaded machine); a call
	// that would leave later is not sent and Do returns a PhaseConnect
	// TransportError wrapping ErrSendLate. With a transport other than the
	// built-in one it is checked only before the round trip starts.
	SendBy time.Time
}

// ErrSendLate is wrapped by the error of a call not sent because it would
// have left after its Call.SendBy.
var ErrSendLate = errors.New("the request would leave after its send deadline")

// ErrConnLost is wrapped by a PhaseConnect error when a connection was in
// hand (dialed, or taken from the pool) and closed before a byte of the
// request was written: the request never left, and the endpoint was
// reachable (a pooled connection the server had just closed, say).
var ErrConnLost = errors.New("the connection closed before the request was written")

// sendByKey carries Call.SendBy to open.
type sendByKey struct{}

// withSendBy returns ctx carrying c's SendBy for open, if it has one.
func withSendBy(ctx context.Context, c Call) context.Context {
	if c.SendBy.IsZero() {
		return ctx
	}
	return context.WithValue(ctx, sendByKey{}, c.SendBy)
}

// Response is a provider's HTTP response, whatever its status.
type Response struct {
	Status int
	Header http.Header
	// Body is the provider body. The Anthropic client converts successful
	// bodies to the OpenAI chat.completion shape and error bodies to the
	// OpenAI error shape, so callers always see OpenAI shapes; a body it
	// cannot parse (say, a proxy's HTML error page) is passed through as-is.
	Body  []byte
	Usage job.Usage
	// Answer is the answer's id, model and finish reasons, for its trace
	// (zero where the client did not read them: a stream, Anthropic).
	Answer    Answer
	RateLimit RateLimit
}

// Client sends one call to one provider. Do returns an error only when no
// HTTP response could be obtained in full; the error is always a
// *TransportError. An HTTP error status is a Response, not an error: pass both
// to Classify. Do never retries.
type Client interface {
	Do(ctx context.Context, c Call) (*Response, error)
}

// Phase says how far a call got before it failed, which decides whether the
// provider may have done (and billed) the work.
type Phase string

const (
	// PhaseBuild: the request could not be built (bad base URL, a body the
	// Anthropic adapter cannot convert). Nothing was sent; retrying cannot help.
	PhaseBuild Phase = "build"
	// PhaseConnect: dialing, the TLS handshake or the connect timeout failed,
	// or the connection broke before a single byte of the request was written.
	// The request never left: safe to retry.
	PhaseConnect Phase = "connect"
	// PhaseAwaitHeaders: the request was (at least partly) sent and no
	// response headers arrived: header timeout, reset or EOF. The provider may
	// or may not have processed it: the outcome is UNKNOWN.
	PhaseAwaitHeaders Phase = "await_headers"
	// PhaseBody: headers arrived and the body was cut (or was too large). The
	// provider almost surely did the work.
	PhaseBody Phase = "body"
	// PhaseStreamStart: a streamed answer's headers arrived, then the
	// stream broke (cut, reset, an error event) or its first token did not
	// come in time, before any output: nothing reached the caller, so the
	// call is retried like a server error. (After the first token a broken
	// stream is never retried: the job ends interrupted.)
	PhaseStreamStart Phase = "stream_start"
)

// ErrFirstTokenTimeout and ErrIdleTimeout end a stream whose first token,
// or next chunk, took longer than allowed.
var (
	ErrFirstTokenTimeout = errors.New("no first token within the first-token timeout")
	ErrIdleTimeout       = errors.New("no chunk within the idle timeout")
)

// TransportError is the only kind of error a Client returns. Err never holds
// the prompt or the API key. When the caller's context ended the call,
// errors.Is(err, context.Canceled) (or DeadlineExceeded) holds.
type TransportError struct {
	Phase Phase
	Err   error
}

func (e *TransportError) Error() string { return "provider " + string(e.Phase) + ": " + e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

// ErrBodyTooLarge is wrapped by a PhaseBody error when the response body
// exceeds MaxBodyBytes.
var ErrBodyTooLarge = errors.New("response body exceeds the size cap")

// newTransport builds the transport both clients use. HTTP/1.1 only (a custom
// DialContext disables Go's automatic HTTP/2), which keeps one request per
// connection, so the per-connection write counter of countingConn tells
// whether this request put any byte on the wire.
func newTransport(connectTimeout, headerTimeout time.Duration) *builtinTransport {
	if connectTimeout <= 0 {
		connectTimeout = DefaultConnectTimeout
	}
	d := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	return &builtinTransport{http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c}, nil
		},
		TLSHandshakeTimeout: connectTimeout,
		// For non-streaming chat completions the headers arrive only when
		// generation is done, so this is effectively a generation timeout.
		ResponseHeaderTimeout: headerTimeout,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		// Shorter than most servers' keep-alive timeouts: a request written on
		// a connection the server is just closing is an UNKNOWN outcome, so we
		// would rather dial afresh.
		IdleConnTimeout: 30 * time.Second,
	}}
}

// builtinTransport marks the transport newTransport built, whose connections
// are all countingConns.
type builtinTransport struct{ http.Transport }

// countingConn counts Write calls so a failed round trip can tell whether any
// request byte may have left. Calls are counted before the write happens: a
// write that fails half way still counts as "may have left". The count errs
// only toward caution: over TLS, a close_notify written while the failed
// connection is torn down also counts, turning a PhaseConnect into a
// PhaseAwaitHeaders, never the reverse (tracker.failure corrects the case
// net/http names: the server had closed the idle connection).
type countingConn struct {
	net.Conn
	writes atomic.Int64
	// sendBy is the Call.SendBy (unix nanoseconds, 0: none) of the request
	// the connection was just handed to; its first write checks it, and
	// refuses (without writing or counting) if the instant has passed.
	sendBy atomic.Int64
	// late is set once a write was refused for sendBy: the connection is
	// being discarded and writes nothing more (not even TLS's
	// close_notify), so the round trip stays a PhaseConnect.
	late atomic.Bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	if by := c.sendBy.Swap(0); by != 0 && time.Now().UnixNano() > by {
		c.late.Store(true)
	}
	if c.late.Load() {
		return 0, ErrSendLate
	}
	c.writes.Add(1)
	n, err := c.Conn.Write(p)
	if n == 0 && errors.Is(err, net.ErrClosed) {
		// Closed on our side before the write: nothing reached the wire.
		c.writes.Add(-1)
	}
	return n, err
}

// tracker follows one round trip through httptrace to decide its Phase.
type tracker struct {
	ours      bool  // the built-in transport: every connection is a countingConn
	sendBy    int64 // Call.SendBy in unix nanoseconds, 0 if none
	mu        sync.Mutex
	getConn   bool // the transport began looking for a connection
	gotConn   bool
	conn      *countingConn
	writes0   int64
	wroteHdrs bool
}

func (t *tracker) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GetConn: func(string) { t.mu.Lock(); t.getConn = true; t.mu.Unlock() },
		GotConn: func(info httptrace.GotConnInfo) {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.gotConn = true
			c := info.Conn
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			if cc, ok := c.(*countingConn); ok {
				t.conn = cc
				t.writes0 = cc.writes.Load()
				// Set for every request, so none inherits another's.
				cc.sendBy.Store(t.sendBy)
			}
		},
		WroteHeaders: func() { t.mu.Lock(); t.wroteHdrs = true; t.mu.Unlock() },
	}
}

// failure decides the phase and the error of a failed RoundTrip. A write
// refused for SendBy closes the connection, and http.Transport may report
// the read error of that close rather than the refusal: the refusal is
// what happened. A PhaseConnect failure after a connection was in hand
// wraps ErrConnLost, so it is not taken for an unreachable endpoint.
func (t *tracker) failure(err error) (Phase, error) {
	phase := t.failedPhase()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case errors.Is(err, ErrSendLate):
	case t.conn != nil && t.conn.late.Load():
		return PhaseConnect, ErrSendLate
	case t.gotConn && err.Error() == serverClosedIdle:
		// Over TLS the close_notify of the teardown was counted, but the
		// request itself cannot have been written.
		return PhaseConnect, fmt.Errorf("%w: %w", ErrConnLost, err)
	case phase == PhaseConnect && t.gotConn:
		return phase, fmt.Errorf("%w: %w", ErrConnLost, err)
	}
	return phase, err
}

// serverClosedIdle is the text of http.Transport's (unexported) error for
// a request handed a kept-alive connection the server had closed: its read
// loop saw the close, and closed the connection, before the request was
// registered on it, so no byte of the request can have been written.
const serverClosedIdle = "http: server closed idle connection"

// failedPhase decides the phase of a failed RoundTrip. http.Transport waits
// for its write loop to finish before returning an error, so the counters are
// final here.
func (t *tracker) failedPhase() Phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.conn != nil:
		if t.conn.writes.Load() == t.writes0 {
			return PhaseConnect
		}
		return PhaseAwaitHeaders
	case t.ours:
		// No connection was handed to this request (dial or TLS failed, or
		// the context ended first): nothing was sent.
		return PhaseConnect
	case t.gotConn:
		// A transport we did not build: no byte counter. Headers are buffered
		// before WroteHeaders fires, so before it nothing reached the wire.
		if !t.wroteHdrs {
			return PhaseConnect
		}
		return PhaseAwaitHeaders
	case t.getConn:
		return PhaseConnect
	default:
		// An opaque RoundTripper that reports nothing: assume the worst.
		return PhaseAwaitHeaders
	}
}

// transportErr builds a TransportError, making sure a context error of the
// caller stays visible through errors.Is.
func transportErr(ctx context.Context, phase Phase, err error) *TransportError {
	if cerr := ctx.Err(); cerr != nil {
		err = &ctxError{ctx: cerr, err: err}
	}
	return &TransportError{Phase: phase, Err: err}
}

// buildErr reports a request that could not be built. msg must not contain
// request content.
func buildErr(format string, args ...any) *TransportError {
	return &TransportError{Phase: PhaseBuild, Err: fmt.Errorf(format, args...)}
}

// endpoint joins a base URL and a path, checking the base.
func endpoint(base, path string) (string, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errors.New("invalid base URL")
	}
	return u.String() + path, nil
}

// send performs one POST and reads the response body in full. It never
// retries.
func send(ctx context.Context, rt http.RoundTripper, target string, body []byte, hdr http.Header, maxResp int) (status int, h http.Header, respBody []byte, err error) {
	resp, err := open(ctx, rt, target, body, hdr)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := readBody(ctx, resp, maxResp)
	return resp.StatusCode, resp.Header, b, err
}

// readBody reads a response body in full, up to maxResp bytes (0:
// MaxBodyBytes).
func readBody(ctx context.Context, resp *http.Response, maxResp int) ([]byte, error) {
	if maxResp <= 0 {
		maxResp = MaxBodyBytes
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxResp)+1))
	if err != nil {
		return nil, transportErr(ctx, PhaseBody, err)
	}
	if len(b) > maxResp {
		return nil, &TransportError{Phase: PhaseBody, Err: ErrBodyTooLarge}
	}
	return b, nil
}

// open performs one POST and returns the response with its body unread.
// It never retries.
func open(ctx context.Context, rt http.RoundTripper, target string, body []byte, hdr http.Header) (*http.Response, error) {
	return openMethod(ctx, rt, http.MethodPost, target, body, hdr)
}

// openMethod is open for any method; a GET sends no body.
func openMethod(ctx context.Context, rt http.RoundTripper, method, target string, body []byte, hdr http.Header) (*http.Response, error) {
	_, ours := rt.(*builtinTransport)
	tr := &tracker{ours: ours}
	if by, ok := ctx.Value(sendByKey{}).(time.Time); ok {
		if time.Now().After(by) {
			return nil, &TransportError{Phase: PhaseConnect, Err: ErrSendLate}
		}
		tr.sendBy = by.UnixNano()
	}
	ctx = httptrace.WithClientTrace(ctx, tr.trace())
	req, err := http.NewRequestWithContext(ctx, method, target, nil)
	if err != nil {
		return nil, buildErr("building request: invalid URL")
	}
	req.Header = hdr
	tracing.ToHTTP(ctx, req.Header) // the call's span is the provider's parent
	// The body is set by hand, without GetBody. http.Transport silently
	// replays a request on a reused keep-alive connection that died under it
	// when the request is "replayable": it has no body or a GetBody to rewind
	// it, and an idempotent method or an Idempotency-Key header — which we
	// send. A replay is a second provider call (and bill) the executor never
	// hears of, so the request must not be replayable: GetBody stays nil and
	// the body is never http.NoBody (even when empty), so the transport cannot
	// rewind it. Retrying is the executor's decision, made with Classify and
	// Plan.
	if method != http.MethodGet {
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
	}
	req.GetBody = nil

	resp, err := rt.RoundTrip(req)
	if err != nil {
		phase, err := tr.failure(err)
		return nil, transportErr(ctx, phase, err)
	}
	return resp, nil
}

func baseHeader(c Call) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json")
	h.Set("User-Agent", "sluice")
	if c.IdempotencyKey != "" {
		h.Set("Idempotency-Key", c.IdempotencyKey)
	}
	if c.JobID != "" {
		h.Set("X-Sluice-Job-Id", c.JobID)
	}
	return h
}

// OpenAIConfig configures an OpenAI-compatible chat-completions endpoint.
type OpenAIConfig struct {
	BaseURL string // e.g. "https://api.openai.com/v1"; the client POSTs to BaseURL+"/chat/completions"
	APIKey  string // sent as "Authorization: Bearer"; omitted when empty
	// MaxResponseBytes caps the response body read (0: MaxBodyBytes); a
	// larger answer is a PhaseBody error with ErrBodyTooLarge.
	MaxResponseBytes int
	// ConnectTimeout bounds dial plus TLS handshake (default 10s).
	ConnectTimeout time.Duration
	// HeaderTimeout bounds the wait for response headers after the request
	// is written. Non-streaming completions send headers only when generation
	// ends, so set it to the longest generation you accept; 0 = no limit (the
	// context governs).
	HeaderTimeout time.Duration
	// Transport replaces the built-in transport (tests). Phase detection is
	// exact only with the built-in one; see TransportError.
	Transport http.RoundTripper
	// Responses: the provider serves the Responses API, and calls of
	// job.EndpointResponses go there (responses.go).
	Responses bool
}

// OpenAI is a Client for OpenAI-compatible chat-completions and embeddings
// APIs.
type OpenAI struct {
	baseURL string
	apiKey  string
	rt      http.RoundTripper
	maxResp int
	native  bool // Responses API (OpenAIConfig.Responses)
}

// NewOpenAI returns a client. An invalid BaseURL surfaces as a PhaseBuild
// error from Do.
func NewOpenAI(cfg OpenAIConfig) *OpenAI {
	rt := cfg.Transport
	if rt == nil {
		rt = newTransport(cfg.ConnectTimeout, cfg.HeaderTimeout)
	}
	return &OpenAI{baseURL: cfg.BaseURL, apiKey: cfg.APIKey, rt: rt, maxResp: cfg.MaxResponseBytes, native: cfg.Responses}
}

// Do POSTs c.Body, untouched, to {BaseURL}/chat/completions, or to
// {BaseURL}/embeddings for an embeddings call.
func (o *OpenAI) Do(ctx context.Context, c Call) (*Response, error) {
	if o.native && c.Endpoint == job.EndpointResponses {
		return o.doResponses(ctx, c)
	}
	ctx = withSendBy(ctx, c)
	path := "/chat/completions"
	if c.Endpoint == job.EndpointEmbeddings {
		path = "/embeddings"
	}
	target, err := endpoint(o.baseURL, path)
	if err != nil {
		return nil, buildErr("%v", err)
	}
	h := baseHeader(c)
	if o.apiKey != "" {
		h.Set("Authorization", "Bearer "+o.apiKey)
	}
	reqBody, err := forChat(c)
	if err != nil {
		return nil, err
	}
	status, hdr, body, err := send(ctx, o.rt, target, reqBody, h, o.maxResp)
	if err != nil {
		return nil, err
	}
	r := &Response{Status: status, Header: hdr, Body: body, RateLimit: ParseRateLimit(hdr, time.Now())}
	if status >= 200 && status < 300 {
		r.Usage, r.Answer = ParseAnswer(body)
	}
	return r, nil
}

// isTimeout reports a net timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isRefused reports a refused connection.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// closeIdle closes the idle connections of rt when it can.
func closeIdle(rt http.RoundTripper) {
	if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// CloseIdleConnections closes kept-alive connections (for shutdown).
func (o *OpenAI) CloseIdleConnections() { closeIdle(o.rt) }

// RequestID returns the provider's id for a response: OpenAI's x-request-id,
// or Anthropic's request-id; "" when neither is present.
func RequestID(h http.Header) string {
	if v := h.Get("X-Request-Id"); v != "" {
		return v
	}
	return h.Get("Request-Id")
}
