package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Strategy names, in the order they are reported.
const (
	RetryOnly    = "retry-only"
	RPMLimiter   = "rpm-limiter"
	TokenShaping = "token-shaping"
	Sluice       = "sluice"
)

// Strategies lists every strategy.
var Strategies = []string{RetryOnly, RPMLimiter, TokenShaping, Sluice}

// strategy offers a workload's jobs to a provider in its own way.
type strategy interface {
	// prepare readies the strategy against the provider at baseURL (…/v1)
	// before the clock starts.
	prepare(ctx context.Context, baseURL string) error
	// run offers every job at once and returns when all have finished or
	// ctx has ended. It reports each job through t.
	run(ctx context.Context, jobs []Job, t *tracker)
	// close releases what prepare made.
	close() error
}

// tracker records when each job of one run was submitted and how it ended.
type tracker struct {
	mu      sync.Mutex
	t0      time.Time
	start   []time.Time
	end     []time.Time // zero while unfinished
	ok      []bool
	left    int
	allDone chan struct{}
	onDone  func()
}

func newTracker(n int, t0 time.Time, onDone func()) *tracker {
	t := &tracker{t0: t0, start: make([]time.Time, n), end: make([]time.Time, n), ok: make([]bool, n),
		left: n, allDone: make(chan struct{}), onDone: onDone}
	for i := range t.start {
		t.start[i] = t0
	}
	if n == 0 {
		close(t.allDone)
	}
	return t
}

// submitted records when job i was handed over (the default is t0).
func (t *tracker) submitted(i int, at time.Time) {
	t.mu.Lock()
	t.start[i] = at
	t.mu.Unlock()
}

// finish records job i's outcome; later reports for the same job are ignored.
func (t *tracker) finish(i int, ok bool) {
	now := time.Now()
	t.mu.Lock()
	if i < 0 || i >= len(t.end) || !t.end[i].IsZero() {
		t.mu.Unlock()
		return
	}
	t.end[i], t.ok[i] = now, ok
	t.left--
	last := t.left == 0
	t.mu.Unlock()
	if t.onDone != nil {
		t.onDone()
	}
	if last {
		close(t.allDone)
	}
}

// summary returns the latencies of the successful jobs, and how many jobs
// failed and how many of those never finished.
func (t *tracker) summary() (lat []time.Duration, failed, unfinished int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.end {
		switch {
		case t.end[i].IsZero():
			failed++
			unfinished++
		case !t.ok[i]:
			failed++
		default:
			lat = append(lat, t.end[i].Sub(t.start[i]))
		}
	}
	return lat, failed, unfinished
}

// direct is a client calling the provider itself: retry-only, rpm-limiter
// or token-shaping.
type direct struct {
	kind   string
	conc   int
	seed   uint64
	policy RetryPolicy
	rpm    int
	tpm    int
	hc     *http.Client
	url    string
}

func newDirect(kind string, conc int, seed uint64, policy RetryPolicy, rpm, tpm int) (*direct, error) {
	switch kind {
	case RetryOnly, RPMLimiter, TokenShaping:
	default:
		return nil, fmt.Errorf("unknown direct strategy %q", kind)
	}
	return &direct{kind: kind, conc: max(conc, 1), seed: seed, policy: policy, rpm: rpm, tpm: tpm, hc: newHTTPClient(conc)}, nil
}

func (d *direct) prepare(_ context.Context, baseURL string) error {
	d.url = baseURL + "/chat/completions"
	return nil
}

// run has conc workers take the jobs in order; each sends its job at once
// and retries it (sleeping through the backoff) until it ends.
func (d *direct) run(ctx context.Context, jobs []Job, t *tracker) {
	c := &caller{hc: d.hc, url: d.url, policy: d.policy}
	switch d.kind {
	case RPMLimiter:
		c.limiter = NewLimiter(d.rpm, 0)
	case TokenShaping:
		c.limiter = NewLimiter(d.rpm, d.tpm)
		c.settle = true
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for w := range d.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(d.seed, uint64(w)))
			for i := range next {
				ok, _ := c.do(ctx, jobs[i], rnd)
				if ctx.Err() != nil && !ok {
					continue // cut off by the deadline: counted as unfinished
				}
				t.finish(i, ok)
			}
		}()
	}
feed:
	for i := range jobs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
}

func (d *direct) close() error {
	d.hc.CloseIdleConnections()
	return nil
}

var _ strategy = (*direct)(nil)
