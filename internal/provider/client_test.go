package provider

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

const okCompletion = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}}`

// newServer starts a loopback server closed with the test.
func newServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func newOpenAI(t *testing.T, base string, headerTimeout time.Duration) *OpenAI {
	t.Helper()
	c := NewOpenAI(OpenAIConfig{BaseURL: base + "/v1", APIKey: "sk-test-secret", ConnectTimeout: time.Second, HeaderTimeout: headerTimeout})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// hijackClose reads the request, then drops the connection without a word.
func hijackClose(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	_ = conn.Close()
}

func transportError(t *testing.T, err error) *TransportError {
	t.Helper()
	var te *TransportError
	if !errors.As(err, &te) {
		t.Fatalf("want *TransportError, got %T %v", err, err)
	}
	return te
}

func TestOpenAISuccess(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, path, auth, idem, jobID, ctype string
		body                                   []byte
	}
	got := make(chan seen, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key"), r.Header.Get("X-Sluice-Job-Id"), r.Header.Get("Content-Type"), b}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Ratelimit-Limit-Requests", "500")
		h.Set("X-Ratelimit-Limit-Tokens", "30000")
		h.Set("X-Ratelimit-Remaining-Requests", "499")
		h.Set("X-Ratelimit-Remaining-Tokens", "29989")
		h.Set("X-Ratelimit-Reset-Requests", "120ms")
		h.Set("X-Ratelimit-Reset-Tokens", "6m0s")
		_, _ = io.WriteString(w, okCompletion)
	})
	c := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1/", APIKey: "sk-test-secret"}) // trailing slash tolerated
	t.Cleanup(c.CloseIdleConnections)
	resp, err := c.Do(t.Context(), Call{Provider: "openai", Model: "gpt-4o-mini", Body: []byte(chatBody), IdempotencyKey: "idem-1", JobID: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s.method != http.MethodPost || s.path != "/v1/chat/completions" {
		t.Errorf("%s %s", s.method, s.path)
	}
	if s.auth != "Bearer sk-test-secret" || s.idem != "idem-1" || s.jobID != "job-1" || s.ctype != "application/json" {
		t.Errorf("headers: %+v", s)
	}
	if string(s.body) != chatBody {
		t.Errorf("body not forwarded as-is: %s", s.body)
	}
	if resp.Status != 200 || string(resp.Body) != okCompletion {
		t.Errorf("response %d %s", resp.Status, resp.Body)
	}
	if u := resp.Usage; u.PromptTokens != 9 || u.CompletionTokens != 2 || u.TotalTokens != 11 || u.CachedTokens != 4 {
		t.Errorf("usage %+v", u)
	}
	want := RateLimit{500, 30000, 499, 29989, 120 * time.Millisecond, 6 * time.Minute, -1, -1, 0}
	if resp.RateLimit != want {
		t.Errorf("ratelimit %+v", resp.RateLimit)
	}
	if o := Classify(resp, nil, time.Now()); o.Class != Success {
		t.Errorf("classified %+v", o)
	}
}

func TestOpenAIErrorStatusIsAResponse(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(429)
		_, _ = io.WriteString(w, oaiErr("requests", "rate_limit_exceeded", "Rate limit reached (RPM)"))
	})
	resp, err := newOpenAI(t, srv.URL, 0).Do(t.Context(), Call{Body: []byte(chatBody)})
	if err != nil {
		t.Fatal(err)
	}
	o := Classify(resp, err, time.Now())
	if o.Class != Retry || o.RetryAfter != 2*time.Second || o.LimitType != "requests" || o.HTTPStatus != 429 {
		t.Errorf("%+v", o)
	}
}

// killOnSecond serves the first request and kills the connection of every
// later one after reading it. It counts killed requests.
func killOnSecond(killed *atomic.Int32) http.HandlerFunc {
	var n atomic.Int32
	return func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			_, _ = io.ReadAll(r.Body)
			_, _ = io.WriteString(w, okCompletion)
			return
		}
		killed.Add(1)
		hijackClose(w, r)
	}
}

// The request that dies on a reused keep-alive connection must not be
// replayed by net/http, even with an Idempotency-Key header.
func TestNoHiddenRetry(t *testing.T) {
	t.Parallel()
	var killed atomic.Int32
	srv := newServer(t, killOnSecond(&killed))
	c := newOpenAI(t, srv.URL, time.Second)
	if _, err := c.Do(t.Context(), Call{Body: []byte(chatBody)}); err != nil {
		t.Fatal(err)
	}
	var reused atomic.Bool
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused.Store(i.Reused) }})
	resp, err := c.Do(ctx, Call{Body: []byte(chatBody), IdempotencyKey: "idem-2", JobID: "job-2"})
	if resp != nil {
		t.Fatalf("unexpected response %d", resp.Status)
	}
	te := transportError(t, err)
	if te.Phase != PhaseAwaitHeaders {
		t.Errorf("phase %s (%v)", te.Phase, err)
	}
	if !reused.Load() {
		t.Error("second call did not reuse the connection: the test proves nothing")
	}
	if n := killed.Load(); n != 1 {
		t.Errorf("server saw %d copies of the request, want 1", n)
	}
	o := Classify(resp, err, time.Now())
	if o.Class != Unknown || !o.OutcomeUnknown || o.SafeToRetry || o.Code != "connection_reset" {
		t.Errorf("%+v", o)
	}
	if strings.Contains(err.Error(), "sk-test-secret") || strings.Contains(err.Error(), "hi") && strings.Contains(err.Error(), "messages") {
		t.Errorf("error leaks: %v", err)
	}
}

// Control for TestNoHiddenRetry: a stock request (GetBody set) with an
// Idempotency-Key IS replayed by net/http, so the test above can tell.
func TestHiddenRetryControl(t *testing.T) {
	t.Parallel()
	var killed atomic.Int32
	srv := newServer(t, killOnSecond(&killed))
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	do := func() error {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader([]byte(chatBody)))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	if err := do(); err != nil {
		t.Fatal(err)
	}
	_ = do()
	if n := killed.Load(); n != 2 {
		t.Errorf("stock transport sent %d copies; expected its hidden replay (2)", n)
	}
}

func TestConnectRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	resp, err := newOpenAI(t, "http://"+addr, time.Second).Do(t.Context(), Call{Body: []byte(chatBody)})
	if resp != nil {
		t.Fatal("response from a closed port")
	}
	if te := transportError(t, err); te.Phase != PhaseConnect {
		t.Errorf("phase %s (%v)", te.Phase, err)
	}
	o := Classify(resp, err, time.Now())
	if o.Class != ConnectFailed || !o.SafeToRetry || o.OutcomeUnknown || o.Code != "connect_refused" {
		t.Errorf("%+v", o)
	}
}

func TestCanceledBeforeSend(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := newOpenAI(t, srv.URL, time.Second).Do(ctx, Call{Body: []byte(chatBody)})
	te := transportError(t, err)
	if te.Phase != PhaseConnect || !errors.Is(err, context.Canceled) {
		t.Errorf("phase %s, err %v", te.Phase, err)
	}
	if o := Classify(nil, err, time.Now()); o.Code != "canceled" || !o.SafeToRetry {
		t.Errorf("%+v", o)
	}
	if hits.Load() != 0 {
		t.Error("server was reached")
	}
}

func TestHeaderTimeout(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-r.Context().Done() // never answers; released when the client hangs up
	})
	start := time.Now()
	resp, err := newOpenAI(t, srv.URL, 100*time.Millisecond).Do(t.Context(), Call{Body: []byte(chatBody)})
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v", el)
	}
	if te := transportError(t, err); te.Phase != PhaseAwaitHeaders {
		t.Errorf("phase %s (%v)", te.Phase, err)
	}
	o := Classify(resp, err, time.Now())
	if o.Class != Unknown || !o.OutcomeUnknown || o.SafeToRetry || o.WorkDone || o.Code != "header_timeout" {
		t.Errorf("%+v", o)
	}
}

func TestCanceledAwaitingHeaders(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-r.Context().Done()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := newOpenAI(t, srv.URL, 0).Do(ctx, Call{Body: []byte(chatBody)})
	te := transportError(t, err)
	if te.Phase != PhaseAwaitHeaders || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("phase %s, err %v", te.Phase, err)
	}
	if o := Classify(nil, err, time.Now()); o.Code != "deadline_exceeded" || !o.OutcomeUnknown {
		t.Errorf("%+v", o)
	}
}

func TestBodyCut(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"chatcmpl-1\",")
		_ = buf.Flush()
		_ = conn.Close()
	})
	resp, err := newOpenAI(t, srv.URL, time.Second).Do(t.Context(), Call{Body: []byte(chatBody)})
	if resp != nil {
		t.Fatal("cut body returned a response")
	}
	if te := transportError(t, err); te.Phase != PhaseBody {
		t.Errorf("phase %s (%v)", te.Phase, err)
	}
	o := Classify(resp, err, time.Now())
	if o.Class != Unknown || !o.WorkDone || o.OutcomeUnknown || o.SafeToRetry || o.Code != "stream_cut" {
		t.Errorf("%+v", o)
	}
}

func TestCanceledReadingBody(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, `{"id":`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Cancel the moment the headers are in, while the body is still owed
	// (the body read is the only phase left: no timing involved).
	inner := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(inner.CloseIdleConnections)
	c := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", APIKey: "sk-test-secret", Transport: cancelOnHeaders{inner, cancel}})
	_, err := c.Do(ctx, Call{Body: []byte(chatBody)})
	te := transportError(t, err)
	if te.Phase != PhaseBody || !errors.Is(err, context.Canceled) {
		t.Errorf("phase %s, err %v", te.Phase, err)
	}
	if o := Classify(nil, err, time.Now()); !o.WorkDone || o.Code != "canceled" {
		t.Errorf("%+v", o)
	}
}

// cancelOnHeaders cancels the call's context once its headers have arrived.
type cancelOnHeaders struct {
	rt     http.RoundTripper
	cancel context.CancelFunc
}

func (c cancelOnHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	if err == nil {
		c.cancel()
	}
	return resp, err
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for range MaxBodyBytes>>20 + 1 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	_, err := newOpenAI(t, srv.URL, time.Second).Do(t.Context(), Call{Body: []byte(chatBody)})
	te := transportError(t, err)
	if te.Phase != PhaseBody || !errors.Is(err, ErrBodyTooLarge) {
		t.Errorf("phase %s, err %v", te.Phase, err)
	}
	if o := Classify(nil, err, time.Now()); o.Code != "body_too_large" || !o.WorkDone {
		t.Errorf("%+v", o)
	}
}

func TestBadBaseURL(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"", "ftp://x", "::not a url", "http://"} {
		_, err := NewOpenAI(OpenAIConfig{BaseURL: base}).Do(t.Context(), Call{Body: []byte(chatBody)})
		te := transportError(t, err)
		if te.Phase != PhaseBuild {
			t.Errorf("%q: phase %s", base, te.Phase)
		}
		if o := Classify(nil, err, time.Now()); o.Class != Fail || o.Code != "invalid_request" {
			t.Errorf("%q: %+v", base, o)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestForeignTransport(t *testing.T) {
	t.Parallel()
	// An opaque RoundTripper that reports nothing: assume the worst.
	opaque := NewOpenAI(OpenAIConfig{BaseURL: "http://example.invalid/v1", Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.GetBody != nil {
			t.Error("GetBody must be nil")
		}
		return nil, errors.New("boom")
	})})
	_, err := opaque.Do(t.Context(), Call{Body: []byte(chatBody)})
	if te := transportError(t, err); te.Phase != PhaseAwaitHeaders {
		t.Errorf("opaque: phase %s", te.Phase)
	}
	// A stock http.Transport reports GetConn but no GotConn on dial failure.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	tr := &http.Transport{}
	stock := NewOpenAI(OpenAIConfig{BaseURL: "http://" + addr, Transport: tr})
	_, err = stock.Do(t.Context(), Call{Body: []byte(chatBody)})
	if te := transportError(t, err); te.Phase != PhaseConnect {
		t.Errorf("stock: phase %s (%v)", te.Phase, err)
	}
	// The stock transport with a killed request: GotConn and WroteHeaders fired.
	srv := newServer(t, hijackClose)
	stock = NewOpenAI(OpenAIConfig{BaseURL: srv.URL, Transport: tr})
	t.Cleanup(stock.CloseIdleConnections)
	_, err = stock.Do(t.Context(), Call{Body: []byte(chatBody)})
	if te := transportError(t, err); te.Phase != PhaseAwaitHeaders {
		t.Errorf("stock killed: phase %s (%v)", te.Phase, err)
	}
}

func TestEmptyBodyNotReplayable(t *testing.T) {
	t.Parallel()
	var seen atomic.Int32
	c := NewOpenAI(OpenAIConfig{BaseURL: "http://example.invalid/v1", Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen.Add(1)
		if r.GetBody != nil || r.Body == nil || r.Body == http.NoBody {
			t.Errorf("empty body would be replayable: GetBody=%v Body=%v", r.GetBody != nil, r.Body)
		}
		return &http.Response{StatusCode: 400, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`))}, nil
	})})
	resp, err := c.Do(t.Context(), Call{IdempotencyKey: "k"})
	if err != nil || resp.Status != 400 || seen.Load() != 1 {
		t.Errorf("%v %v", resp, err)
	}
}
