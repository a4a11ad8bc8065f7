package provider

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"
)

// TestSendByCheckedAtTheWire: a paced call must leave by its SendBy, and the
// instant that counts is the write, not the start of Do: getting a
// connection (dialing, or waiting for a pooled one) took 20 ms on a loaded
// machine after the executor had checked its tolerance, and the provider
// saw the call later than the plan allowed. A call whose connection comes
// too late is not sent, whether the connection is new or reused; one in
// time is.
func TestSendByCheckedAtTheWire(t *testing.T) {
	t.Parallel()
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[tls], func(t *testing.T) {
			t.Parallel()
			testSendBy(t, tls)
		})
	}
}

func testSendBy(t *testing.T, tls bool) {
	var got atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, okCompletion)
	})
	srv := httptest.NewUnstartedServer(h)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	c := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1"})
	if tls {
		c.rt.(*builtinTransport).TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	}
	defer c.CloseIdleConnections()
	// slowConn delays the moment the connection is in hand past SendBy.
	var reused atomic.Bool
	slowConn := func(d time.Duration) context.Context {
		return httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			reused.Store(i.Reused)
			// Time is the logic: the connection must come after SendBy, a
			// wall-clock instant the client checks.
			time.Sleep(d)
		}})
	}
	late := func(name string, wantReused bool) {
		t.Helper()
		_, err := c.Do(slowConn(60*time.Millisecond), Call{Body: []byte(chatBody), SendBy: time.Now().Add(20 * time.Millisecond)})
		var te *TransportError
		if !errors.Is(err, ErrSendLate) || !errors.As(err, &te) || te.Phase != PhaseConnect {
			t.Errorf("%s: got %v, want a PhaseConnect error wrapping ErrSendLate", name, err)
		}
		if reused.Load() != wantReused {
			t.Errorf("%s: connection reused %v, want %v", name, reused.Load(), wantReused)
		}
	}

	late("new connection", false)
	if n := got.Load(); n != 0 {
		t.Fatalf("the provider received %d calls whose connection came after SendBy, want 0", n)
	}
	// In time: sent (and its connection kept for the next call).
	if _, err := c.Do(t.Context(), Call{Body: []byte(chatBody), SendBy: time.Now().Add(time.Second)}); err != nil {
		t.Fatalf("a call in time: %v", err)
	}
	late("reused connection", true)
	// Already past SendBy when Do starts: not sent either.
	if _, err := c.Do(t.Context(), Call{Body: []byte(chatBody), SendBy: time.Now().Add(-time.Millisecond)}); !errors.Is(err, ErrSendLate) {
		t.Errorf("a call past SendBy before it started: got %v, want ErrSendLate", err)
	}
	// Without SendBy nothing is checked.
	if _, err := c.Do(slowConn(30*time.Millisecond), Call{Body: []byte(chatBody)}); err != nil {
		t.Fatalf("a call without SendBy: %v", err)
	}
	if n := got.Load(); n != 2 {
		t.Errorf("the provider received %d calls, want 2 (the ones in time and without SendBy)", n)
	}
}
