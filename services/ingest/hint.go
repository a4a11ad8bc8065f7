package ingest

import (
	"context"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Wait hints are cheap answers to producers INTAKE refused; they must not
// let one tenant take the service from the others.
const (
	// MaxHintBytes is the largest hint request whose body is tokenized;
	// a larger one is estimated from its size (its model unknown: the
	// longest wait over the models), so a request costs little whatever
	// its size.
	MaxHintBytes = 64 << 10
	// hintsPending and hintsPendingBytes bound what the hint subscription
	// buffers (on a connection of its own, Config.Hints); beyond them
	// requests are dropped.
	hintsPending      = 256
	hintsPendingBytes = 4 << 20
	// hintsPerTenant and hintsInFlight bound the hint requests answered at
	// once, per tenant and in all; one beyond them is not answered (the
	// producer waits its default, client.DefaultRetryAfter).
	hintsPerTenant = 2
	hintsInFlight  = 16
)

// hintGate runs wait-hint requests concurrently, a few per tenant.
type hintGate struct {
	mu     sync.Mutex
	by     map[string]int
	n      int
	wg     sync.WaitGroup
	closed bool
}

// serve answers m with fn's reply in its own goroutine, or drops it when
// its tenant (or everyone) has as many in flight as allowed.
func (g *hintGate) serve(ctx context.Context, m *nats.Msg, fn func(context.Context, *nats.Msg)) {
	tenant := strings.TrimPrefix(m.Subject, job.WaitPrefix)
	g.mu.Lock()
	if g.closed || g.n >= hintsInFlight || g.by[tenant] >= hintsPerTenant {
		g.mu.Unlock()
		return
	}
	if g.by == nil {
		g.by = map[string]int{}
	}
	g.by[tenant]++
	g.n++
	g.wg.Add(1)
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		defer func() {
			g.mu.Lock()
			if g.by[tenant]--; g.by[tenant] == 0 {
				delete(g.by, tenant)
			}
			g.n--
			g.mu.Unlock()
		}()
		fn(ctx, m)
	}()
}

// close refuses new requests and waits for those in flight.
func (g *hintGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}
