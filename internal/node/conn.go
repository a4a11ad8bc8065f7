package node

import (
	"context"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
)

// The node's connection reconnects without end (nats.MaxReconnects(-1)),
// but the client also closes it for good on some server errors (a
// protocol error such as a control line over the server's limit, an
// authorization violation). Every service of the process depends on it,
// so a closed connection ends the process with an error, for a supervisor
// to restart it, and /healthz fails meanwhile.

// connClosed blocks until the connection is closed (an error naming the
// last one) or ctx ends (its error).
func connClosed(ctx context.Context, nc *nats.Conn, closed <-chan struct{}) error {
	select {
	case <-closed:
		return fmt.Errorf("nats connection closed for good (last error: %v); stopping so the process can be restarted", nc.LastError())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// healthz answers 200 while the process can still work: its connection is
// up or reconnecting, not closed.
func healthz(nc *nats.Conn) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if nc.IsClosed() {
			http.Error(w, "nats: connection closed", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
}
