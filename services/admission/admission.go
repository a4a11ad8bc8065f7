// Package admission is Sluice's rate-aware dispatcher. It takes jobs from
// QUEUE in batches, ends expired ones, sends jobs whose not_before is in the
// future back to wait (JetStream redelivery delay, never a sleeping
// goroutine), reserves the rest against the shared per-model budgets with one
// compare-and-set per model per batch, and publishes what it reserved to
// DISPATCH. Jobs that do not fit wait by redelivery delay until their
// estimated turn.
package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Config is what admission needs.
type Config struct {
	App *config.Config
	Now func() time.Time
}

// Candidate is a job ready for a reservation.
type Candidate struct {
	Job  *job.Job
	Msg  jetstream.Msg
	Cost budget.Cost

	counted bool      // already counted as demand
	touched time.Time // last InProgress (or delivery)
}

// Service is the admission service.
type Service struct {
	cfg       Config
	mesh      *mesh.Mesh
	store     *budget.Store
	log       *slog.Logger
	m         *metrics.Set
	now       func() time.Time
	models    map[string]*modelState // per budget key: the jobs held for it
	heldIdx   map[string]string      // job id -> budget key, for "why does it wait"
	heldJobs  map[string]*Candidate  // job id -> the held candidate
	notBefore map[string]time.Time   // job id -> when it is due (waiting in JetStream)
	held      int
	heldBytes int
	leases    map[string]*lease       // per budget key: this process's block of the current slice
	tblocks   map[string]*tenantBlock // per tenant window key: this process's block
	tenantMin *budget.Store           // tenants' per-minute windows
	tenantDay *budget.Store           // tenants' per-day windows
	budgetErr atomic.Value            // last budget store error (string), "" when healthy
}

// New builds the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, log *slog.Logger, ms *metrics.Set) (*Service, error) {
	if cfg.App == nil {
		return nil, errors.New("admission: no configuration")
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	a := cfg.App.Admission
	st := budget.NewStore(m.Budgets, budget.Params{Slice: a.Slice.D(), DispatchGrace: a.DispatchGrace.D(), BurstFraction: a.BurstFraction}, now)
	st.Writes = ms.BudgetWrites.Inc
	st.Conflicts = ms.BudgetConflict.Inc
	grace := a.DispatchGrace.D() + a.Slice.D() // the model lease may land one slice later
	tmin := budget.NewStore(m.Budgets, budget.Params{Slice: a.Slice.D(), DispatchGrace: grace, BurstFraction: 1}, now)
	tday := budget.NewStore(m.Budgets, budget.Params{Window: 24 * time.Hour, Slice: time.Minute, DispatchGrace: grace, BurstFraction: 1}, now)
	for _, x := range []*budget.Store{tmin, tday} {
		x.Writes, x.Conflicts = ms.BudgetWrites.Inc, ms.BudgetConflict.Inc
	}
	s := &Service{cfg: cfg, mesh: m, store: st, tenantMin: tmin, tenantDay: tday, log: log.With("service", "admission"), m: ms, now: now, models: map[string]*modelState{}, heldIdx: map[string]string{}, heldJobs: map[string]*Candidate{}, notBefore: map[string]time.Time{}, leases: map[string]*lease{}, tblocks: map[string]*tenantBlock{}}
	s.budgetErr.Store("")
	return s, nil
}

// Ready reports whether admission can reach the budget store.
func (s *Service) Ready() error {
	if e := s.budgetErr.Load().(string); e != "" {
		return fmt.Errorf("budget store: %s", e)
	}
	return nil
}

// Run consumes QUEUE until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	cons, err := streams.EnsureConsumer(ctx, s.mesh.JS, streams.Queue, "admission", "", "")
	if err != nil {
		return err
	}
	batch := s.cfg.App.Admission.Batch
	in := make(chan jetstream.Msg, batch)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		select {
		case in <- msg:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(batch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			s.log.Debug("queue consume", "err", err)
		}
	}))
	if err != nil {
		return fmt.Errorf("consume queue: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watchDepth(ctx)
	}()
	defer func() {
		cc.Stop()
		wg.Wait()
	}()
	pauses := make(chan pauseSignal, 64)
	psub, err := s.mesh.JS.Conn().Subscribe(PauseSubjectPrefix+">", func(m *nats.Msg) {
		var p pauseSignal
		if json.Unmarshal(m.Data, &p) == nil {
			p.Key = budget.ModelKey(p.Provider, job.ModelToken(p.Model))
			select {
			case pauses <- p:
			default:
			}
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe pauses: %w", err)
	}
	defer func() { _ = psub.Unsubscribe() }()
	whys := make(chan whyQuery)
	wsub, err := s.mesh.JS.Conn().Subscribe(WhySubjectPrefix+"*", func(m *nats.Msg) {
		q := whyQuery{id: strings.TrimPrefix(m.Subject, WhySubjectPrefix), reply: make(chan *Waiting, 1)}
		select {
		case whys <- q:
		case <-ctx.Done():
			return
		}
		if w := <-q.reply; w != nil {
			data, _ := json.Marshal(w)
			_ = m.Respond(data)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe why: %w", err)
	}
	defer func() { _ = wsub.Unsubscribe() }()

	msgs := make([]jetstream.Msg, 0, batch)
	tick := time.NewTicker(s.store.Params().Slice)
	defer tick.Stop()
	touch := time.NewTicker(KeepAliveEvery)
	defer touch.Stop()
	for {
		select {
		case <-ctx.Done():
			s.returnLeases(context.WithoutCancel(ctx), true)
			s.releaseAll()
			return nil
		case <-tick.C:
			s.returnLeases(ctx, false)
			s.expireHeld(ctx)
			s.dispatchAll(ctx)
			continue
		case <-touch.C:
			s.keepAlive()
			for _, p := range job.Priorities {
				n := 0
				for _, ms := range s.models {
					n += ms.sched.ClassLen(p)
				}
				s.m.Held.WithLabelValues(string(p)).Set(float64(n))
			}
			continue
		case p := <-pauses:
			ms := s.models[p.Key]
			if ms != nil && p.Until.After(ms.pausedUntil) {
				ms.pausedUntil, ms.reason = p.Until, "paused_provider"
			}
			continue
		case q := <-whys:
			q.reply <- s.why(q.id)
			continue
		case m := <-in:
			msgs = append(msgs[:0], m)
		}
	drain:
		for len(msgs) < batch {
			select {
			case m := <-in:
				msgs = append(msgs, m)
			default:
				break drain
			}
		}
		s.admit(ctx, msgs)
	}
}

// admit takes a batch from QUEUE: expired jobs end, jobs not due yet wait
// in JetStream, the rest join their model's fair queue; then whatever the
// budgets allow is dispatched.
func (s *Service) admit(ctx context.Context, msgs []jetstream.Msg) {
	now := s.now()
	for _, msg := range msgs {
		var j job.Job
		if err := json.Unmarshal(msg.Data(), &j); err != nil || j.ID == "" || j.Estimate == nil {
			s.log.Error("queue: undecodable job dropped", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			continue
		}
		if j.Deadline != nil && !j.Deadline.After(now) {
			s.expire(ctx, msg, &j, "deadline passed while queued")
			continue
		}
		if j.NotBefore != nil && j.NotBefore.After(now) {
			if j.Deadline != nil && j.NotBefore.After(*j.Deadline) {
				s.expire(ctx, msg, &j, "the next attempt would start after the deadline")
				continue
			}
			s.m.AdmissionWaits.WithLabelValues(j.Provider, j.Model, "not_before").Inc()
			s.notBefore[j.ID] = *j.NotBefore
			_ = msg.NakWithDelay(j.NotBefore.Sub(now))
			continue
		}
		delete(s.notBefore, j.ID)
		s.hold(&Candidate{Job: &j, Msg: msg, Cost: budget.Cost{Requests: 1, Tokens: j.Estimate.Cost()}}, now)
	}
	s.dispatchAll(ctx)
}

type pub struct {
	id  string
	msg jetstream.Msg
	fut jetstream.PubAckFuture
}

// reserve tries to reserve budget for popped, in the fair order the
// scheduler gave; what the budgets refuse goes back to the scheduler, in
// order, and the model sleeps until the budget is expected to free.
func (s *Service) reserve(ctx context.Context, ms *modelState, popped []*Item) []*pub {
	key := ms.key
	cands := make([]*Candidate, len(popped))
	byCand := map[*Candidate]*Item{}
	for i, it := range popped {
		cands[i] = it.Value.(*Candidate)
		byCand[cands[i]] = it
		delete(s.heldIdx, cands[i].Job.ID)
	}
	putBack := func(rest []*Candidate, wake time.Time, reason string) {
		for i := len(rest) - 1; i >= 0; i-- {
			it := byCand[rest[i]]
			ms.sched.Unpop(it)
			s.held++
			s.heldBytes += it.Size
			s.heldIdx[rest[i].Job.ID] = key
			s.heldJobs[rest[i].Job.ID] = rest[i]
		}
		// Look again within MaxWakeWait even if the estimate says later:
		// other processes may give budget back sooner.
		if limit := s.now().Add(MaxWakeWait); wake.After(limit) {
			wake = limit
		}
		ms.wakeAt, ms.reason = wake, reason
	}
	_, model, ok := s.cfg.App.ModelRef(ms.model)
	if !ok {
		for _, c := range cands {
			s.fail(ctx, c, &job.Error{Code: job.CodeUnknownModel, Message: fmt.Sprintf("model %q is no longer configured", ms.model)})
		}
		return nil
	}
	allowed, held, err := s.tenantGate(ctx, cands)
	if err != nil {
		s.storeDown(key, err)
		putBack(cands, s.now().Add(time.Second), "budget_store")
		return nil
	}
	if len(allowed) == 0 {
		return nil
	}
	lim := budget.Limits{RPM: model.RPM, TPM: model.TPM}
	urgent := byCand[allowed[0]].Urgent
	if h := s.cfg.App.Admission.HeadroomShare(); h > 0 && !urgent && s.now().Sub(ms.lastUrgent) < UrgentMemory {
		// Work that should not wait is about: backlogs leave it room.
		lim.Keep, lim.KeepAtLeast = h, budget.Cost{Requests: 1, Tokens: ms.urgentCost}
	}
	n, _ := ms.sched.Len()
	backlog := budget.Cost{Requests: n, Tokens: ms.sched.Tokens()}
	if urgent {
		// An interactive job or a new flow may use the headroom, but only
		// for urgent work: no room is asked for the backlog behind it.
		backlog = budget.Cost{}
	}
	g, err := s.lease(ctx, key, lim, allowed, backlog, urgent)
	// Tenant budget taken for jobs the model cannot take now goes back.
	s.giveBack(ctx, held, allowed[min(g.N, len(allowed)):])
	if err != nil {
		// Fail closed: no budget, no dispatch.
		s.storeDown(key, err)
		putBack(allowed, s.now().Add(time.Second), "budget_store")
		return nil
	}
	s.budgetErr.Store("")
	now := s.now()
	var out []*pub
	for i, c := range allowed[:g.N] {
		j := c.Job
		j.Reservation = &job.Reservation{
			ID: fmt.Sprintf("%d-%d", g.Slice, i), Requests: c.Cost.Requests, Tokens: c.Cost.Tokens,
			ReservedAt: now.UTC(), ValidUntil: g.ValidUntil.UTC(),
		}
		s.m.TokensReserved.WithLabelValues(j.Provider, j.Model).Add(float64(c.Cost.Tokens))
		if len(j.Attempts) == 0 {
			s.m.QueueWait.WithLabelValues(string(j.Priority), j.TaskType()).Observe(now.Sub(j.SubmittedAt).Seconds())
		}
		data, _ := json.Marshal(j)
		msg := nats.NewMsg(job.DispatchSubject(j.Provider, j.Model))
		msg.Data = data
		// One dispatch per QUEUE message: a redelivery of the same message
		// (a crash between publish and ack) is dropped by DISPATCH's
		// duplicate window, while a job re-admitted later is a new message.
		msg.Header.Set(jetstream.MsgIDHeader, "dispatch:"+j.ID+":"+seqOf(c.Msg))
		fut, err := s.mesh.JS.PublishMsgAsync(msg)
		if err != nil {
			s.log.Warn("dispatch publish failed", "job_id", j.ID, "err", err)
			_ = c.Msg.NakWithDelay(time.Second)
			continue
		}
		out = append(out, &pub{id: j.ID, msg: c.Msg, fut: fut})
		s.log.Debug("dispatched", "job_id", j.ID, "tenant", j.Tenant, "queued_for", now.Sub(j.SubmittedAt))
	}
	if rest := allowed[g.N:]; len(rest) > 0 {
		wake := g.RetryAt
		if wake.Before(now) {
			wake = now
		}
		var keep []*Candidate
		for _, c := range rest {
			s.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, g.Reason).Inc()
			if dl := c.Job.Deadline; dl != nil && wake.After(*dl) {
				// The budget frees after its deadline: end it now, honestly,
				// rather than let it wait in vain.
				s.expire(ctx, c.Msg, c.Job, fmt.Sprintf("estimated wait %s for %s budget exceeds the deadline", wake.Sub(now).Round(time.Millisecond), g.Reason))
				continue
			}
			keep = append(keep, c)
		}
		putBack(keep, wake, g.Reason)
	} else {
		ms.wakeAt, ms.reason = time.Time{}, ""
	}
	return out
}

func (s *Service) storeDown(key string, err error) {
	s.m.BudgetErrors.Inc()
	s.budgetErr.Store(err.Error())
	s.log.Warn("budget store unavailable; holding jobs", "key", key, "err", err)
}

// MaxWakeWait bounds how long a model's queue sleeps before it checks the
// budget again.
const MaxWakeWait = time.Second

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

func (s *Service) expire(ctx context.Context, msg jetstream.Msg, j *job.Job, why string) {
	res := &job.Result{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusExpired, Attempts: len(j.Attempts),
		Error: &job.Error{Code: job.CodeDeadlineExpired, Message: why}, SubmittedAt: j.SubmittedAt, Provider: j.Provider, Model: j.Model}
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	if err := s.mesh.PublishResult(ctx, res, opKey); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

func (s *Service) fail(ctx context.Context, c *Candidate, e *job.Error) {
	j := c.Job
	res := &job.Result{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusFailed, Attempts: len(j.Attempts), Error: e, SubmittedAt: j.SubmittedAt}
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	if err := s.mesh.PublishResult(ctx, res, opKey); err != nil {
		_ = c.Msg.NakWithDelay(time.Second)
		return
	}
	_ = c.Msg.Ack()
}

// watchDepth publishes QUEUE depth per priority as a metric.
func (s *Service) watchDepth(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		depth, err := QueueDepth(ctx, s.mesh.JS)
		if err != nil {
			continue
		}
		for _, p := range job.Priorities {
			s.m.QueueDepth.WithLabelValues(string(p), "all").Set(float64(depth[p]))
		}
	}
}

// QueueDepth counts the jobs waiting in QUEUE per priority.
func QueueDepth(ctx context.Context, js jetstream.JetStream) (map[job.Priority]int, error) {
	st, err := js.Stream(ctx, streams.Queue)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(job.QueuePrefix+">"))
	if err != nil {
		return nil, err
	}
	out := map[job.Priority]int{}
	for subj, n := range info.State.Subjects {
		parts := strings.Split(subj, ".")
		if len(parts) >= 3 {
			out[job.Priority(parts[2])] += int(n)
		}
	}
	return out, nil
}

// seqOf returns a message's stream sequence, for message ids that must be
// the same on redelivery and different for a new message.
func seqOf(msg jetstream.Msg) string {
	md, err := msg.Metadata()
	if err != nil {
		return job.NewID()
	}
	return fmt.Sprint(md.Sequence.Stream)
}

// lease is this process's share of one slice's budget, reserved with one
// compare-and-set and spent locally until the slice ends; what is left at
// the end goes back to the shared window. It is two blocks: one taken
// against the limits less the headroom, which any job may spend, and one
// taken against the full limits for urgent jobs (interactive ones, new
// flows), which only they may spend, so backlogged work never eats the
// headroom through a block.
type lease struct {
	slice int64
	left  budget.Cost // the block any job may spend
	room  budget.Cost // the block only urgent jobs may spend
	// Demand seen in the current slice and smoothed per slice (requests,
	// tokens), for all jobs and for urgent ones.
	asked, askedUrgent   budget.Cost
	demand, demandUrgent [2]float64
}

// leaseChunks is how many pieces the predicted extra demand is asked in, so
// a partly full window still grants some of it.
const leaseChunks = 4

// demandChunks splits an expected extra demand into up to leaseChunks
// pieces of whole average jobs (each with its share of the tokens), so a
// partly full window grants some of it and what it grants fits jobs.
func demandChunks(requests, tokens int) []budget.Cost {
	if requests <= 0 || tokens <= 0 {
		return nil
	}
	k := min(requests, leaseChunks)
	out := make([]budget.Cost, k)
	for i := range out {
		out[i] = budget.Cost{Requests: requests / k, Tokens: tokens / k}
	}
	return out
}

// backlogChunks is how many average jobs of a backlog one lease asks room for.
const backlogChunks = 32

// lease admits the longest prefix of cands: first from this process's
// blocks for the current slice, then by taking a new block sized to the
// rest plus the backlog (some of it) or the demand expected in the slice.
// One compare-and-set per slice per model in steady state, whatever the job
// rate. urgent says cands may spend the headroom (lim then has no Keep).
func (s *Service) lease(ctx context.Context, key string, lim budget.Limits, cands []*Candidate, backlog budget.Cost, urgent bool) (budget.Grant, error) {
	l := s.leases[key]
	if l == nil {
		l = &lease{slice: -1}
		s.leases[key] = l
	}
	cur := s.store.SliceOf(s.now())
	if l.slice != cur {
		s.giveBackLease(ctx, key, l)
		const a = 0.3
		smooth := func(d *[2]float64, c budget.Cost) {
			d[0] = (1-a)*d[0] + a*float64(c.Requests)
			d[1] = (1-a)*d[1] + a*float64(c.Tokens)
		}
		smooth(&l.demand, l.asked)
		smooth(&l.demandUrgent, l.askedUrgent)
		l.slice, l.asked, l.askedUrgent = cur, budget.Cost{}, budget.Cost{}
	}
	g := budget.Grant{Slice: cur, ValidUntil: s.store.ValidUntil(cur)}
	for _, c := range cands {
		// Demand is new arrivals: a job asking again after a wait is not
		// more demand.
		if c.counted {
			continue
		}
		c.counted = true
		if md, err := c.Msg.Metadata(); err == nil && md.NumDelivered > 1 {
			continue
		}
		l.asked.Requests += c.Cost.Requests
		l.asked.Tokens += c.Cost.Tokens
		if urgent {
			l.askedUrgent.Requests += c.Cost.Requests
			l.askedUrgent.Tokens += c.Cost.Tokens
		}
	}
	// Spend the blocks: urgent jobs their own first.
	blocks := []*budget.Cost{&l.left}
	if urgent {
		blocks = []*budget.Cost{&l.room, &l.left}
	}
	for _, c := range cands {
		spent := false
		for _, b := range blocks {
			if c.Cost.Requests <= b.Requests && c.Cost.Tokens <= b.Tokens {
				b.Requests -= c.Cost.Requests
				b.Tokens -= c.Cost.Tokens
				spent = true
				break
			}
		}
		if !spent {
			break
		}
		g.N++
	}
	rest := cands[g.N:]
	if len(rest) == 0 {
		return g, nil
	}
	// Take a new block: the jobs waiting, then room for the backlog behind
	// them or the demand expected for the rest of the slice.
	costs := make([]budget.Cost, 0, len(rest)+backlogChunks)
	var need budget.Cost
	for _, c := range rest {
		costs = append(costs, c.Cost)
		need.Requests += c.Cost.Requests
		need.Tokens += c.Cost.Tokens
	}
	demand := l.demand
	if urgent {
		demand = l.demandUrgent
	}
	switch extraR, extraT := int(demand[0])-need.Requests, int(demand[1])-need.Tokens; {
	case backlog.Requests > 0:
		// Jobs wait behind these: ask for room for them too, one average
		// job per chunk, so what fits is spent locally without more round
		// trips.
		avg := max(backlog.Tokens/backlog.Requests, 1)
		for range min(backlog.Requests, backlogChunks) {
			costs = append(costs, budget.Cost{Requests: 1, Tokens: avg})
		}
	default:
		costs = append(costs, demandChunks(extraR, extraT)...)
	}
	tg, err := s.store.Take(ctx, key, lim, costs)
	if err != nil {
		return g, err
	}
	if tg.N > 0 && tg.Slice != cur {
		// The slice turned during the round trip: the block belongs to the
		// new one.
		s.giveBackLease(ctx, key, l)
		if g.N > 0 {
			// Jobs already spent from the old blocks keep the old slice's
			// validity; only the new ones move. Keep it simple: admit none
			// of the new ones now and give the block back.
			var back budget.Cost
			for _, c := range costs[:tg.N] {
				back.Requests += c.Requests
				back.Tokens += c.Tokens
			}
			_ = s.store.Return(ctx, key, tg.Slice, back)
			l.slice = tg.Slice
			g.Reason, g.RetryAt = "slice_turned", s.now()
			return g, nil
		}
		l.slice = tg.Slice
		g.Slice, g.ValidUntil = tg.Slice, tg.ValidUntil
	}
	granted := min(tg.N, len(rest))
	g.N += granted
	keep := &l.left
	if urgent {
		keep = &l.room
	}
	for _, c := range costs[granted:tg.N] { // room beyond the jobs given: kept as the block
		keep.Requests += c.Requests
		keep.Tokens += c.Tokens
	}
	g.Reason, g.RetryAt = tg.Reason, tg.RetryAt
	if g.N < len(cands) && g.Reason == "" {
		g.Reason, g.RetryAt = "burst", s.store.ValidUntil(cur).Add(-s.store.Params().DispatchGrace)
	}
	return g, nil
}

// giveBackLease returns what is left of both blocks to the shared window.
func (s *Service) giveBackLease(ctx context.Context, key string, l *lease) {
	left := budget.Cost{Requests: l.left.Requests + l.room.Requests, Tokens: l.left.Tokens + l.room.Tokens}
	if left.Requests <= 0 && left.Tokens <= 0 {
		l.left, l.room = budget.Cost{}, budget.Cost{}
		return
	}
	if err := s.store.Return(ctx, key, l.slice, left); err != nil {
		s.log.Debug("lease return", "key", key, "err", err)
		return
	}
	l.left, l.room = budget.Cost{}, budget.Cost{}
}

// tenantHold is what one tenant's jobs of a batch took from its budgets.
type tenantHold struct {
	minKey, dayKey     string
	minSlice, daySlice int64
	costs              map[*Candidate]budget.Cost
}

// tenantGate applies tenants' own budgets (per minute and per day, when
// configured) to a model's candidates, in order. Jobs over their tenant's
// budget wait by redelivery delay; the rest go on, with what they took
// recorded so it can be given back if the model's budget refuses them.
func (s *Service) tenantGate(ctx context.Context, cands []*Candidate) ([]*Candidate, map[string]*tenantHold, error) {
	byTenant := map[string][]*Candidate{}
	limited := false
	for _, c := range cands {
		if t, ok := s.cfg.App.Tenant(c.Job.Tenant); ok && t.HasLimits() {
			limited = true
		}
		byTenant[c.Job.Tenant] = append(byTenant[c.Job.Tenant], c)
	}
	if !limited {
		return cands, nil, nil
	}
	now := s.now()
	held := map[string]*tenantHold{}
	refused := map[*Candidate]bool{}
	for name, group := range byTenant {
		t, ok := s.cfg.App.Tenant(name)
		if !ok || !t.HasLimits() {
			continue
		}
		costs := make([]budget.Cost, len(group))
		for i, c := range group {
			costs[i] = c.Cost
		}
		h := &tenantHold{minKey: "tenant." + name + ".minute", dayKey: "tenant." + name + ".day", costs: map[*Candidate]budget.Cost{}}
		n := len(group)
		var retry time.Time
		reason := ""
		if t.RPM > 0 || t.TPM > 0 {
			g, err := s.tenantTake(ctx, s.tenantMin, h.minKey, budget.Limits{RPM: t.RPM, TPM: t.TPM}, costs)
			if err != nil {
				return cands, nil, err
			}
			n, h.minSlice, retry, reason = g.N, g.Slice, g.RetryAt, "tenant_"+g.Reason
		}
		if (t.RPD > 0 || t.TPD > 0) && n > 0 {
			g, err := s.tenantTake(ctx, s.tenantDay, h.dayKey, budget.Limits{RPM: t.RPD, TPM: t.TPD}, costs[:n])
			if err != nil {
				return cands, nil, err
			}
			h.daySlice = g.Slice
			if g.N < n {
				var back budget.Cost
				for _, c := range costs[g.N:n] {
					back.Requests += c.Requests
					back.Tokens += c.Tokens
				}
				if t.RPM > 0 || t.TPM > 0 {
					s.tenantReturn(ctx, s.tenantMin, h.minKey, h.minSlice, back)
				}
				n, retry, reason = g.N, g.RetryAt, "tenant_day_"+g.Reason
			}
		}
		for i, c := range group {
			if i < n {
				h.costs[c] = c.Cost
				continue
			}
			refused[c] = true
			s.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, reason).Inc()
			wait := max(retry.Sub(now), 50*time.Millisecond) + jitter(s.store.Params().Slice)
			if dl := c.Job.Deadline; dl != nil && now.Add(wait).After(*dl) {
				s.expire(ctx, c.Msg, c.Job, fmt.Sprintf("tenant budget (%s) frees after the deadline", reason))
				continue
			}
			_ = c.Msg.NakWithDelay(min(wait, time.Minute))
		}
		held[name] = h
	}
	out := cands[:0:0]
	for _, c := range cands {
		if !refused[c] {
			out = append(out, c)
		}
	}
	return out, held, nil
}

// tenantBlock is this process's block of one tenant window's current slice,
// like the model's lease: taken with one compare-and-set, sized to the
// tenant's demand per tick, spent locally, and given back when the slice
// ends (a day window's, whose slices are minutes, at every tick).
type tenantBlock struct {
	store  *budget.Store
	slice  int64
	left   budget.Cost
	asked  budget.Cost
	demand [2]float64
}

// tenantTake grants the longest prefix of costs from the tenant window key:
// from this process's block first, then with one compare-and-set for the
// rest plus the tenant's expected demand for the slice.
func (s *Service) tenantTake(ctx context.Context, st *budget.Store, key string, lim budget.Limits, costs []budget.Cost) (budget.Grant, error) {
	b := s.tblocks[key]
	if b == nil {
		b = &tenantBlock{store: st, slice: -1}
		s.tblocks[key] = b
	}
	cur := st.SliceOf(s.now())
	if b.slice != cur {
		s.returnBlock(ctx, key, b)
		b.slice = cur
	}
	g := budget.Grant{Slice: cur, ValidUntil: st.ValidUntil(cur)}
	for _, c := range costs {
		b.asked.Requests += c.Requests
		b.asked.Tokens += c.Tokens
	}
	for _, c := range costs {
		if c.Requests > b.left.Requests || c.Tokens > b.left.Tokens {
			break
		}
		b.left.Requests -= c.Requests
		b.left.Tokens -= c.Tokens
		g.N++
	}
	rest := costs[g.N:]
	if len(rest) == 0 {
		return g, nil
	}
	ask := append(make([]budget.Cost, 0, len(rest)+leaseChunks), rest...)
	var need budget.Cost
	for _, c := range rest {
		need.Requests += c.Requests
		need.Tokens += c.Tokens
	}
	// The demand per tick, or what this tick has already seen if more (a
	// stream that just started).
	estR, estT := max(int(b.demand[0]), b.asked.Requests), max(int(b.demand[1]), b.asked.Tokens)
	ask = append(ask, demandChunks(estR-need.Requests, estT-need.Tokens)...)
	tg, err := st.Take(ctx, key, lim, ask)
	if err != nil {
		return g, err
	}
	if tg.N > 0 && tg.Slice != cur {
		// The slice turned during the round trip; what was spent from the
		// old block stays in the old slice, the new grant in the new one.
		// Keep it simple: give the new grant back and admit only what the
		// old block covered.
		var back budget.Cost
		for _, c := range ask[:tg.N] {
			back.Requests += c.Requests
			back.Tokens += c.Tokens
		}
		_ = st.Return(ctx, key, tg.Slice, back)
		g.Reason, g.RetryAt = "slice_turned", s.now()
		return g, nil
	}
	granted := min(tg.N, len(rest))
	g.N += granted
	for _, c := range ask[granted:tg.N] {
		b.left.Requests += c.Requests
		b.left.Tokens += c.Tokens
	}
	g.Reason, g.RetryAt = tg.Reason, tg.RetryAt
	return g, nil
}

// tenantReturn gives back budget taken in slice: to this process's block
// while that slice lasts, else to the shared window.
func (s *Service) tenantReturn(ctx context.Context, st *budget.Store, key string, slice int64, c budget.Cost) {
	if b := s.tblocks[key]; b != nil && b.slice == slice {
		b.left.Requests += c.Requests
		b.left.Tokens += c.Tokens
		return
	}
	_ = st.Return(ctx, key, slice, c)
}

// returnBlock gives what is left of a tenant block back to its window.
func (s *Service) returnBlock(ctx context.Context, key string, b *tenantBlock) {
	if b.left.Requests <= 0 && b.left.Tokens <= 0 {
		b.left = budget.Cost{}
		return
	}
	if err := b.store.Return(ctx, key, b.slice, b.left); err != nil {
		s.log.Debug("tenant block return", "key", key, "err", err)
		return
	}
	b.left = budget.Cost{}
}

// giveBack returns the tenant budget of candidates the model refused.
func (s *Service) giveBack(ctx context.Context, held map[string]*tenantHold, refused []*Candidate) {
	if len(held) == 0 || len(refused) == 0 {
		return
	}
	back := map[string]budget.Cost{}
	for _, c := range refused {
		h := held[c.Job.Tenant]
		if h == nil {
			continue
		}
		if cost, ok := h.costs[c]; ok {
			b := back[c.Job.Tenant]
			b.Requests += cost.Requests
			b.Tokens += cost.Tokens
			back[c.Job.Tenant] = b
		}
	}
	for name, b := range back {
		h := held[name]
		t, _ := s.cfg.App.Tenant(name)
		if t.RPM > 0 || t.TPM > 0 {
			s.tenantReturn(ctx, s.tenantMin, h.minKey, h.minSlice, b)
		}
		if t.RPD > 0 || t.TPD > 0 {
			s.tenantReturn(ctx, s.tenantDay, h.dayKey, h.daySlice, b)
		}
	}
}

// returnLeases gives back what is left of blocks whose slice has passed (or
// all of them, at shutdown), so the shared window shows only real use.
func (s *Service) returnLeases(ctx context.Context, all bool) {
	cur := s.store.SliceOf(s.now())
	for key, l := range s.leases {
		if l.slice == cur && !all {
			continue
		}
		s.giveBackLease(ctx, key, l)
	}
	now := s.now()
	for key, b := range s.tblocks {
		// The demand per tick, for sizing the next blocks.
		const a = 0.3
		b.demand[0] = (1-a)*b.demand[0] + a*float64(b.asked.Requests)
		b.demand[1] = (1-a)*b.demand[1] + a*float64(b.asked.Tokens)
		b.asked = budget.Cost{}
		// A day window's slice is a minute: its blocks go back at every
		// tick rather than hold other processes off for that long.
		if b.slice == b.store.SliceOf(now) && !all && b.store.Params().Window <= time.Minute {
			continue
		}
		s.returnBlock(ctx, key, b)
	}
}
