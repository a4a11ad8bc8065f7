// Package natstest starts a fresh embedded NATS server with JetStream for a
// test (like net/http/httptest), on a random loopback port with a temporary
// store. Tests wait with its Eventually or Poll (for an end state) and Pace
// or At (for a load or fault schedule, where wall time is the logic), never
// with time.Sleep.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/embedded"
)

// Server starts a fresh embedded JetStream server on a random loopback port
// with a temporary store, and shuts it down when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// ConnectTimeout bounds a test's dial to its server: far above nats.go's
// 2 s, which a CPU-starved machine (a whole suite on 2 cores) can exceed
// on loopback.
const ConnectTimeout = 30 * time.Second

// Conn connects to s and closes the connection when the test ends.
func Conn(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.Timeout(ConnectTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
