package provider

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestLateSendWhateverTheTransportReports: a write refused for SendBy
// closes the connection, and http.Transport may then report the read
// error of that close ("use of closed network connection") instead of the
// refusal: its round trip selects at random between the write loop's
// error and the read loop's when both are ready, which they are when the
// calling goroutine is descheduled between handing over the request and
// its select (a loaded machine). The call was refused as late, so it is
// not sent and is not an unreachable endpoint. The transport here does
// what http.Transport does in that race.
func TestLateSendWhateverTheTransportReports(t *testing.T) {
	t.Parallel()
	c := NewOpenAI(OpenAIConfig{BaseURL: "http://sim.invalid/v1", Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		client, server := net.Pipe()
		defer server.Close()
		cc := &countingConn{Conn: client}
		httptrace.ContextClientTrace(r.Context()).GotConn(httptrace.GotConnInfo{Conn: cc, Reused: true})
		cc.sendBy.Store(time.Now().Add(-time.Second).UnixNano()) // the connection came after SendBy
		if _, err := cc.Write([]byte("POST")); !errors.Is(err, ErrSendLate) {
			t.Errorf("write: %v, want ErrSendLate", err)
		}
		_ = cc.Close()
		_, err := cc.Read(make([]byte, 1))
		return nil, err
	})})
	_, err := c.Do(t.Context(), Call{Body: []byte(chatBody), SendBy: time.Now().Add(time.Hour)})
	if te := transportError(t, err); te.Phase != PhaseConnect || !errors.Is(err, ErrSendLate) {
		t.Fatalf("phase %s, err %v; want a PhaseConnect error wrapping ErrSendLate", te.Phase, err)
	}
	if o := Classify(nil, err, time.Now()); o.Code != "send_late" || o.Unreachable() {
		t.Errorf("%+v, want send_late, not unreachable", o)
	}
}

// closeSignal reports the first Close of the connection it wraps.
type closeSignal struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeSignal) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestPooledConnClosedBeforeWrite: the server closes a kept-alive
// connection just as a call takes it from the pool, and the transport
// closes it before a byte of the request is written. The request never
// left (safe to retry), and the endpoint was reachable a moment ago: not
// a connect failure that takes the deployment down.
func TestPooledConnClosedBeforeWrite(t *testing.T) {
	t.Parallel()
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[tls], func(t *testing.T) {
			t.Parallel()
			testPooledConnClosed(t, tls)
		})
	}
}

// testPooledConnClosed: over TLS the transport's teardown writes a
// close_notify, which must not make the request look sent.
func testPooledConnClosed(t *testing.T, tls bool) {
	var got atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		_, _ = io.WriteString(w, okCompletion)
	}))
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	c := newOpenAI(t, srv.URL, time.Second)
	if tls {
		c.rt.(*builtinTransport).TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	}
	closed := make(chan chan struct{}, 2)
	d := &net.Dialer{}
	c.rt.(*builtinTransport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cs := &closeSignal{Conn: raw, closed: make(chan struct{})}
		closed <- cs.closed
		return &countingConn{Conn: cs}, nil
	}
	if _, err := c.Do(t.Context(), Call{Body: []byte(chatBody)}); err != nil {
		t.Fatal(err)
	}
	pooled := <-closed
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			t.Error("the second call did not reuse the pooled connection")
			return
		}
		srv.CloseClientConnections()
		select { // the transport saw the server's close and closed its end
		case <-pooled:
		case <-time.After(10 * time.Second):
			t.Error("the transport never closed the connection the server closed")
		}
	}})
	_, err := c.Do(ctx, Call{Body: []byte(chatBody)})
	te := transportError(t, err)
	if te.Phase != PhaseConnect || !errors.Is(err, ErrConnLost) {
		t.Fatalf("phase %s, err %v; want a PhaseConnect error wrapping ErrConnLost", te.Phase, err)
	}
	o := Classify(nil, err, time.Now())
	if o.Class != ConnectFailed || !o.SafeToRetry || o.Code != "connection_closed" || o.Unreachable() {
		t.Errorf("%+v, want a safe retry coded connection_closed, not unreachable", o)
	}
	if n := got.Load(); n != 1 {
		t.Errorf("the provider received %d calls, want 1", n)
	}
}

// TestUnreachable: only what says the endpoint cannot be reached is.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", dial(syscall.ECONNREFUSED), true},
		{"connect timeout", dial(timeoutErr{}), true},
		{"name does not resolve", dial(&net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}), true},
		{"tls", errors.New("tls: handshake failure"), true},
		{"pooled connection closed", errors.Join(ErrConnLost, io.EOF), false},
		{"sent late", ErrSendLate, false},
		{"canceled", &ctxError{ctx: context.Canceled, err: dial(context.Canceled)}, false},
		{"deadline", &ctxError{ctx: context.DeadlineExceeded, err: dial(timeoutErr{})}, false},
	} {
		o := Classify(nil, &TransportError{Phase: PhaseConnect, Err: tc.err}, time.Now())
		if o.Unreachable() != tc.want || o.Class != ConnectFailed || !o.SafeToRetry {
			t.Errorf("%s: %+v unreachable %v, want %v (a safe connect retry)", tc.name, o, o.Unreachable(), tc.want)
		}
	}
	if (Outcome{Class: Unknown, Code: "connection_reset"}).Unreachable() {
		t.Error("a reset after the request left is not unreachable")
	}
}

// TestWriteOnClosedConnNotCounted: a write the connection refuses because
// it was already closed on our side put nothing on the wire, so the
// request still never left.
func TestWriteOnClosedConnNotCounted(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &countingConn{Conn: raw}
	if _, err := cc.Write([]byte("POST")); err != nil {
		t.Fatal(err)
	}
	_ = cc.Close()
	if _, err := cc.Write([]byte("POST")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if n := cc.writes.Load(); n != 1 {
		t.Errorf("writes %d, want 1: the write after close reached nothing", n)
	}
}
