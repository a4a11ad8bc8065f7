package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// A stream bounds messages per tenant (per subject) but bytes only in all,
// so one tenant's large jobs could fill it for everyone. shares bounds each
// tenant's bytes in QUEUE and INTAKE (queues.*.max_bytes_per_tenant).
//
// JetStream counts a tenant's messages (per subject) but not their bytes,
// and does not say which of them are still there. So a share keeps a
// ledger of the tenant's jobs this process saw enter the stream (size and
// sequence; a sequence not yet known is bounded by the stream's last
// sequence at the next refresh), and once a second reads the exact count
// of the tenant's waiting messages and the stream's first sequence. Every
// waiting job is in the ledger (if this process saw it enter) at a
// sequence at or after the first, so the sum of the largest count entries
// from there on is at least the tenant's bytes: whatever order jobs leave
// in (tiny ones admitted while large ones wait), the bound holds. Jobs
// added since the refresh count in full. Waiting jobs the ledger lacks
// (another ingest process's, re-queued attempts, those from before this
// process started) count at the stream's mean message size. Entries are
// folded, oldest first, into groups (count, largest size, last sequence)
// when a tenant has more than ledgerGroups, which only over-counts.

// ledgerGroups bounds the groups a tenant's ledger keeps.
const ledgerGroups = 4096

type share struct {
	stream, filter string
	key            string // the config key of the bound, for messages
	bounds         config.StreamBounds
	bound          atomic.Int64 // per tenant, from bounds and the tenants configured (setTenants)
	tenants        atomic.Int64 // the count bound was computed for

	mu      sync.Mutex
	at      time.Time
	lastSeq uint64            // the stream's last sequence at the last refresh
	epoch   uint64            // refreshes begun: an entry's epoch says which it preceded
	counts  map[string]uint64 // tenant -> messages waiting
	ledgers map[string]*ledger
}

// ledger is one tenant's jobs in the stream, oldest first.
type ledger struct {
	groups []group
	base   int64 // bytes at the last refresh (the bound on them)
	added  int64 // bytes added since
}

// group is count jobs of at most size bytes each, at sequences up to seq
// (0: not yet known: at most the stream's last as read by the first
// refresh begun after epoch).
type group struct {
	seq, epoch uint64
	count      uint64
	size       int64
}

func newShare(stream, filter, key string, b config.StreamBounds, tenants int) *share {
	sh := &share{stream: stream, filter: filter, key: key, bounds: b,
		counts: map[string]uint64{}, ledgers: map[string]*ledger{}}
	sh.tenants.Store(-1)
	sh.setTenants(tenants)
	return sh
}

// setTenants recomputes the bound when there are n tenants now, not as
// many as it was computed for (a reload may change them).
func (sh *share) setTenants(n int) {
	if sh.tenants.Swap(int64(n)) != int64(n) {
		sh.bound.Store(sh.bounds.TenantBytes(n))
	}
}

// tenantOfSubject is the last token of a QUEUE or INTAKE subject.
func tenantOfSubject(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// refresh rereads the per-tenant message counts, at most once a second, and
// settles each ledger against them.
func (sh *share) refresh(ctx context.Context, js jetstream.JetStream, now time.Time) {
	sh.mu.Lock()
	if now.Sub(sh.at) < time.Second {
		sh.mu.Unlock()
		return
	}
	sh.at = now
	// Entries noted until now were published before the read below: the
	// stream's last sequence it returns bounds theirs.
	before := sh.epoch
	sh.epoch++
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
	var mean int64
	if info.State.Msgs > 0 {
		mean = int64(info.State.Bytes / info.State.Msgs)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.counts, sh.lastSeq = counts, info.State.LastSeq
	for t, l := range sh.ledgers {
		l.settle(before, info.State.LastSeq, info.State.FirstSeq, counts[t], mean)
		if counts[t] == 0 && len(l.groups) == 0 {
			delete(sh.ledgers, t)
		}
	}
}

// settle seals at last the sequences of the groups noted by epoch before,
// drops the groups wholly before first (gone from the stream), or all
// noted by then when none of the tenant's waits, and recomputes the bound
// on the tenant's bytes for its n waiting messages.
func (l *ledger) settle(before, last, first, n uint64, mean int64) {
	keep := l.groups[:0]
	for _, g := range l.groups {
		if g.epoch <= before {
			if g.seq == 0 {
				g.seq = last
			}
			if n == 0 || g.seq < first {
				continue
			}
		}
		keep = append(keep, g)
	}
	l.groups = keep
	sized := slices.Clone(l.groups)
	slices.SortFunc(sized, func(a, b group) int { return cmp.Compare(b.size, a.size) })
	var sum int64
	left := n
	for _, g := range sized {
		if left == 0 {
			break
		}
		k := min(left, g.count)
		sum += int64(k) * g.size
		left -= k
	}
	l.base, l.added = sum+int64(left)*mean, 0
}

// add notes a job of size bytes at seq (0: not known yet), in epoch.
func (l *ledger) add(seq, epoch uint64, size int64) {
	l.groups = append(l.groups, group{seq: seq, epoch: epoch, count: 1, size: size})
	l.added += size
	if len(l.groups) > ledgerGroups {
		// Fold the oldest pairs: a group keeps its largest size and its
		// last sequence, so it is never dropped while a job of it may wait.
		half := len(l.groups) / 2
		folded := l.groups[:0]
		for i := 0; i+1 < half; i += 2 {
			a, b := l.groups[i], l.groups[i+1]
			seq := max(a.seq, b.seq)
			if a.seq == 0 || b.seq == 0 {
				seq = 0
			}
			folded = append(folded, group{seq: seq, epoch: max(a.epoch, b.epoch), count: a.count + b.count, size: max(a.size, b.size)})
		}
		if half%2 == 1 {
			folded = append(folded, l.groups[half-1])
		}
		l.groups = append(folded, l.groups[half:]...)
	}
}

func (sh *share) ledger(tenant string) *ledger {
	l := sh.ledgers[tenant]
	if l == nil {
		l = &ledger{}
		sh.ledgers[tenant] = l
	}
	return l
}

// arrived notes a message of tenant of size bytes at stream sequence seq,
// delivered to this process: in the ledger (once), and counted as waiting
// if the last refresh did not count it.
func (sh *share) arrived(tenant string, seq uint64, size int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.ledger(tenant)
	if slices.ContainsFunc(l.groups, func(g group) bool { return g.seq == seq && g.count == 1 }) {
		return // a redelivery
	}
	l.add(seq, sh.epoch, int64(size)) // counted in full until the next refresh
	if seq > sh.lastSeq {
		sh.counts[tenant]++
	}
}

// note records a job of tenant of size bytes that this process put on the
// stream (its sequence unknown): it counts as waiting, in full, until the
// next refresh.
func (sh *share) note(tenant string, size int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.ledger(tenant).add(0, sh.epoch, int64(size))
	sh.counts[tenant]++
}

// gone counts one of tenant's jobs as no longer waiting (until the next
// refresh). Its bytes stay counted until then.
func (sh *share) gone(tenant string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.counts[tenant] > 0 {
		sh.counts[tenant]--
	}
}

// bytes bounds tenant's bytes in the stream and returns its messages.
func (sh *share) bytes(tenant string) (int64, uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.counts[tenant]
	l := sh.ledgers[tenant]
	if l == nil {
		return 0, n
	}
	return l.base + l.added, n
}

// over reports, as a message, whether size more bytes of tenant would take
// it past its bound; "" when they fit.
func (sh *share) over(tenant string, size int) (string, uint64) {
	have, n := sh.bytes(tenant)
	bound := sh.bound.Load()
	if have+int64(size) <= bound {
		return "", n
	}
	return fmt.Sprintf("tenant %q's jobs waiting in %s hold about %s, and this one would take them past the tenant's bound of %s (%s)",
		tenant, sh.stream, mib(have), mib(bound), sh.key), n
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// envelopeSize bounds a job's size on QUEUE as the stream counts it: its
// request plus the envelope's fields, the subject, the headers and the
// store's own few bytes per message.
func envelopeSize(j *task.Task) int { return len(j.Request) + envelopeBytes }

// envelopeBytes is the room a job's envelope takes beside its request on
// QUEUE (fields, attempts, seal, subject, headers), with a margin.
const envelopeBytes = 2 << 10

// storedSize is the size the stream counts for a delivered message: its
// subject, headers and data, and the store's bytes per message.
func storedSize(msg jetstream.Msg) int {
	n := len(msg.Subject()) + len(msg.Data()) + 64
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// queueRoom refuses j for now when its tenant's jobs in QUEUE would hold
// more than the tenant's bound. The wait it suggests is the tenant's own
// jobs ahead at the model's rate: those are what must drain first.
func (s *acceptor) queueRoom(ctx context.Context, j *task.Task, model *config.Model, cost int) error {
	s.queueShare.setTenants(len(s.app().Tenants))
	s.queueShare.refresh(ctx, s.mesh.JS, s.now())
	msg, n := s.queueShare.over(j.Tenant, envelopeSize(j))
	if msg == "" {
		return nil
	}
	avg := s.queue.backlog(ctx, 0).avgCost
	return &BusyError{Code: job.CodeQueueFull, RetryAfter: max(waitFor(model, n, avg, cost, true), time.Second), Ahead: n, Message: msg, Bound: s.queueShare.key}
}

// intakeOver returns a refusal for an INTAKE job that cannot move on to
// QUEUE now (busy) when its tenant's jobs in INTAKE hold more than the
// tenant's bound there: waiting, it would keep other tenants out of INTAKE,
// whose bytes JetStream bounds only in all. Whatever keeps it out of QUEUE
// (its tenant's own bound, shedding, QUEUE full as a whole), a job past its
// tenant's share is refused rather than kept waiting; each tenant's jobs
// within its share wait, and the shares add up to no more than INTAKE.
func (s *intake) intakeOver(ctx context.Context, tenant string, busy error) error {
	if !errors.Is(busy, ErrQueueFull) {
		return nil
	}
	s.intakeShare.setTenants(len(s.app().Tenants))
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
