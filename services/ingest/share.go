package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// A stream bounds messages per tenant (per subject) but bytes only in all,
// so one tenant's large jobs could fill it for everyone. shares bounds each
// tenant's bytes in QUEUE and INTAKE (queues.*.max_bytes_per_tenant).
// JetStream counts messages per subject but not bytes, so a tenant's bytes
// are estimated: its messages in the stream (read at most once a second,
// counted up locally in between) times the mean size of its latest jobs this
// process saw, as many as it has waiting (exact while one process ingests,
// since a tenant's jobs leave in about the order they came).

// sizeSamples is how many of a tenant's latest job sizes a share keeps.
const sizeSamples = 256

type share struct {
	stream, filter string
	key            string // the config key of the bound, for messages
	bound          int64

	mu      sync.Mutex
	at      time.Time
	lastSeq uint64            // the stream's last sequence at the last refresh
	counts  map[string]uint64 // tenant -> messages waiting
	sizes   map[string]*sizeRing
}

type sizeRing struct {
	buf  [sizeSamples]int32
	n, i int
}

func newShare(stream, filter, key string, b config.StreamBounds, tenants int) *share {
	return &share{stream: stream, filter: filter, key: key, bound: b.TenantBytes(tenants),
		counts: map[string]uint64{}, sizes: map[string]*sizeRing{}}
}

// tenantOfSubject is the last token of a QUEUE or INTAKE subject.
func tenantOfSubject(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// refresh rereads the per-tenant message counts, at most once a second.
func (sh *share) refresh(ctx context.Context, js jetstream.JetStream, now time.Time) {
	sh.mu.Lock()
	if now.Sub(sh.at) < time.Second {
		sh.mu.Unlock()
		return
	}
	sh.at = now
	sh.mu.Unlock()
	st, err := js.Stream(ctx, sh.stream)
	if err != nil {
		return
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(sh.filter))
	if err != nil {
		return
	}
	counts := map[string]uint64{}
	for subj, n := range info.State.Subjects {
		counts[tenantOfSubject(subj)] += n
	}
	sh.mu.Lock()
	sh.counts, sh.lastSeq = counts, info.State.LastSeq
	sh.mu.Unlock()
}

// arrived counts a message of tenant at stream sequence seq, delivered for
// the first time, as waiting if the last refresh did not count it: a burst
// between two refreshes is seen as it comes.
func (sh *share) arrived(tenant string, seq uint64, first bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if first && seq > sh.lastSeq {
		sh.counts[tenant]++
	}
}

// note records the size of a job of tenant seen in the stream; added also
// counts it as waiting (until the next refresh).
func (sh *share) note(tenant string, size int, added bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := sh.sizes[tenant]
	if r == nil {
		r = &sizeRing{}
		sh.sizes[tenant] = r
	}
	r.buf[r.i] = int32(min(size, 1<<30))
	r.i = (r.i + 1) % sizeSamples
	r.n = min(r.n+1, sizeSamples)
	if added {
		sh.counts[tenant]++
	}
}

// gone counts one of tenant's jobs as no longer waiting (until the next
// refresh).
func (sh *share) gone(tenant string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.counts[tenant] > 0 {
		sh.counts[tenant]--
	}
}

// bytes estimates tenant's bytes in the stream and returns its messages.
func (sh *share) bytes(tenant string) (int64, uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.counts[tenant]
	r := sh.sizes[tenant]
	if n == 0 || r == nil || r.n == 0 {
		return 0, n
	}
	k := min(int(n), r.n)
	var sum int64
	for j := 1; j <= k; j++ {
		sum += int64(r.buf[(r.i-j+sizeSamples)%sizeSamples])
	}
	return sum * int64(n) / int64(k), n
}

// over reports, as a message, whether size more bytes of tenant would take
// it past its bound; "" when they fit.
func (sh *share) over(tenant string, size int) (string, uint64) {
	have, n := sh.bytes(tenant)
	if have+int64(size) <= sh.bound {
		return "", n
	}
	return fmt.Sprintf("tenant %q's jobs waiting in %s hold about %s, and this one would take them past the tenant's bound of %s (%s)",
		tenant, sh.stream, mib(have), mib(sh.bound), sh.key), n
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// envelopeSize approximates a job's size on QUEUE: its request plus the
// envelope's fields.
func envelopeSize(j *job.Job) int { return len(j.Request) + 512 }

// queueRoom refuses j for now when its tenant's jobs in QUEUE would hold
// more than the tenant's bound. The wait it suggests is the tenant's own
// jobs ahead at the model's rate: those are what must drain first.
func (s *Service) queueRoom(ctx context.Context, j *job.Job, model *config.Model, cost int) error {
	s.queueShare.refresh(ctx, s.mesh.JS, s.now())
	msg, n := s.queueShare.over(j.Tenant, envelopeSize(j))
	if msg == "" {
		return nil
	}
	avg := s.backlog(ctx, 0).avgCost
	return &BusyError{Code: job.CodeQueueFull, RetryAfter: max(waitFor(model, n, avg, cost, true), time.Second), Ahead: n, Message: msg, Bound: s.queueShare.key}
}

// intakeOver returns a refusal for an INTAKE job that cannot move on to
// QUEUE now (busy) when its tenant's jobs in INTAKE hold more than the
// tenant's bound there: waiting, it would keep other tenants out of INTAKE,
// whose bytes JetStream bounds only in all. Whatever keeps it out of QUEUE
// (its tenant's own bound, shedding, QUEUE full as a whole), a job past its
// tenant's share is refused rather than kept waiting; each tenant's jobs
// within its share wait, and the shares add up to no more than INTAKE.
func (s *Service) intakeOver(ctx context.Context, tenant string, busy error) error {
	if !errors.Is(busy, ErrQueueFull) {
		return nil
	}
	s.intakeShare.refresh(ctx, s.mesh.JS, s.now())
	msg, _ := s.intakeShare.over(tenant, 0)
	if msg == "" {
		return nil
	}
	return &job.ValidationError{Code: job.CodeQueueFull, Message: msg + "; the job is refused, not kept waiting"}
}

func newShares(c *config.Config) (queue, intake *share) {
	return newShare(streams.Queue, job.QueuePrefix+">", "queues.queue.max_bytes_per_tenant", c.Queues.Queue, len(c.Tenants)),
		newShare(streams.Intake, job.IntakePrefix+">", "queues.intake.max_bytes_per_tenant", c.Queues.Intake, len(c.Tenants))
}
