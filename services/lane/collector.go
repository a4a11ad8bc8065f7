package lane

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	ilane "github.com/sluice-dev/sluice/internal/lane"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// env is what every part of a deployment's lane reads: the service, the
// deployment and its lane's configuration, the batch client, the budgets
// bucket and the lane's lease. Each part embeds the one env its collector
// made.
type env struct {
	*Service
	provider, model string
	kind            string // the provider's kind
	upstream        string
	lane            config.BatchLane
	client          provider.BatchClient
	kv              jetstream.KeyValue
	keyBase         string // lane.<provider>.<model>.
	unit            string // tokens or requests: what the budget counts
	limit           int64  // the budget's limit (0: none)
	lease           *lease
	tick, ackWait   time.Duration
}

// collector runs one deployment's lane in this process: it owns whether
// this process works the lane (it acts only while it holds the lane's
// lease) and the order of each turn; the parts it wires own the rest.
type collector struct {
	*env
	owning bool
	jobs   *gatherer
	sub    *submitter
	fol    *follower
	recs   *records
}

// gatherer owns the LANE messages this process holds: it reads them and
// sorts each (a line of an open batch, a job already ended, one a batch
// with no record marked, or a job to collect), keeps them alive, and
// keeps the jobs not yet in a batch in arrival order.
type gatherer struct {
	*env
	recs *records
	fin  *finisher

	cons    jetstream.Consumer
	held    map[string]*held // job key -> its LANE message
	pending []string         // job keys not yet in a batch, in arrival order
	since   time.Time        // when the oldest pending job arrived
}

// held is a job this process holds the LANE message of.
type held struct {
	msg      jetstream.Msg
	j        *task.Task
	opKey    string
	seq      uint64
	progress time.Time // last InProgress (or delivery)
}

func (s *Service) newCollector(ctx context.Context, p config.Provider, md config.Model, l config.BatchLane) (*collector, error) {
	bc, err := s.client(p, l)
	if err != nil {
		return nil, err
	}
	tick := min(l.Poll.D(), l.Collect.D(), time.Second)
	tick = max(tick, 20*time.Millisecond)
	ttl := min(max(10*tick, time.Second), 30*time.Second)
	c := wire(&env{Service: s, provider: p.Name, model: md.Name, kind: p.Kind, upstream: md.UpstreamName(), lane: l, client: bc,
		kv: s.m.Budgets, keyBase: "lane." + p.Name + "." + job.ModelToken(md.Name) + ".", tick: tick, ackWait: 3 * ttl})
	c.unit, c.limit = "tokens", l.EnqueuedTokens
	if p.Kind == "anthropic" {
		c.unit, c.limit = "requests", int64(l.QueueRequests)
	}
	c.ms.LaneEnqueued.WithLabelValues(c.provider, c.model, c.unit, "limit").Set(float64(c.limit))
	c.lease = &lease{kv: c.kv, key: c.keyBase + "lease", holder: s.cfg.Holder, ttl: ttl, now: s.now}
	tmpl, err := streams.Consumer(streams.Lane, "collector")
	if err != nil {
		return nil, err
	}
	tmpl.Durable = "lane-" + p.Name + "-" + job.ModelToken(md.Name)
	tmpl.FilterSubject = ilane.Subject(p.Name, md.Name)
	tmpl.AckWait = c.ackWait
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = streams.Retry(rctx, func(ctx context.Context) (err error) {
		c.jobs.cons, err = s.m.JS.CreateOrUpdateConsumer(ctx, streams.Lane, tmpl)
		return err
	})
	return c, err
}

// wire makes a lane's parts and tells each the others it calls.
func wire(e *env) *collector {
	bud := &laneBudget{env: e}
	recs := &records{env: e, budget: bud, batches: map[string]*open{}}
	jobs := &gatherer{env: e, recs: recs, held: map[string]*held{}}
	fin := &finisher{env: e, jobs: jobs}
	sub := &submitter{env: e, jobs: jobs, recs: recs, budget: bud, fin: fin, most: e.lane.MaxLines}
	fol := &follower{env: e, jobs: jobs, sub: sub, recs: recs, budget: bud, fin: fin}
	jobs.fin, fin.sub, sub.fol = fin, sub, fol
	return &collector{env: e, jobs: jobs, sub: sub, fol: fol, recs: recs}
}

// run works the lane every tick until ctx ends.
func (c *collector) run(ctx context.Context) {
	t := time.NewTicker(c.tick)
	defer t.Stop()
	for {
		c.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step is one turn: take or keep the lease, read new jobs, keep held
// messages alive, send a batch when one is due, follow the open ones.
func (c *collector) step(ctx context.Context) {
	if !c.lease.held(ctx) {
		if c.owning {
			c.log.Warn("lane: lease lost; leaving the lane to its new holder", "provider", c.provider, "model", c.model)
			c.letGo()
		}
		return
	}
	if !c.owning {
		if err := c.recs.load(ctx); err != nil {
			c.log.Warn("lane: batch records unreadable; retrying", "provider", c.provider, "model", c.model, "err", err)
			return
		}
		c.owning = true
		c.log.Info("lane: holding the lane", "provider", c.provider, "model", c.model, "open_batches", len(c.recs.batches))
	}
	c.jobs.fetch(ctx)
	c.jobs.keepAlive()
	c.sub.divertDue(ctx)
	c.sub.submitDue(ctx)
	c.fol.follow(ctx)
	c.ms.LaneOpen.WithLabelValues(c.provider, c.model).Set(float64(len(c.recs.batches)))
}

// letGo forgets what this process held: its messages go to the new
// holder by redelivery.
func (c *collector) letGo() {
	for _, h := range c.jobs.held {
		_ = h.msg.Nak()
	}
	c.owning, c.jobs.held, c.jobs.pending, c.recs.batches = false, map[string]*held{}, nil, map[string]*open{}
}

// fetch reads the LANE messages waiting (new jobs and redeliveries) and
// sorts each: a line of a known batch, a job already ended, or a job to
// collect.
func (c *gatherer) fetch(ctx context.Context) {
	batch, err := c.cons.FetchNoWait(1000)
	if err != nil {
		return
	}
	index := c.lineIndex()
	now := c.now()
	for msg := range batch.Messages() {
		c.take(ctx, msg, index, now)
	}
}

// lineIndex maps each job key in an open batch to its batch.
func (c *gatherer) lineIndex() map[string]string {
	idx := map[string]string{}
	for id, o := range c.recs.batches {
		for _, l := range o.rec.Lines {
			idx[keys.Job(l.Tenant, l.Job)] = id
		}
	}
	return idx
}

func (c *gatherer) take(ctx context.Context, msg jetstream.Msg, index map[string]string, now time.Time) {
	j := new(task.Task)
	if err := json.Unmarshal(msg.Data(), j); err != nil || !job.ValidName(j.ID) || !job.ValidName(j.Tenant) {
		c.log.Error("lane: undecodable job dropped", "subject", msg.Subject())
		_ = msg.Term()
		return
	}
	md, _ := msg.Metadata()
	h := &held{msg: msg, j: j, progress: now}
	if md != nil {
		h.seq = md.Sequence.Stream
	}
	h.opKey, _ = mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	key := j.Key()
	if prev, ok := c.held[key]; ok {
		prev.msg, prev.progress = msg, now // a redelivery of a job held
		return
	}
	if _, ok := index[key]; ok {
		c.held[key] = h // a line of an open batch: its end maps back to it
		return
	}
	op, _, err := c.m.GetOp(ctx, h.opKey)
	switch {
	case err != nil && !errors.Is(err, job.ErrNotFound):
		_ = msg.NakWithDelay(c.tick) // read again later
		return
	case op != nil && op.JobID == j.ID && (op.State == mesh.OpCompleted || op.State == mesh.OpFailed):
		_ = msg.Ack() // ended already
		return
	case op != nil && op.JobID == j.ID && op.Cancelled && op.Sent == nil:
		c.held[key] = h
		c.fin.cancelled(ctx, h) // its caller cancelled it: never submitted
		return
	case op != nil && op.Sent != nil && strings.HasPrefix(op.Sent.By, markPrefix):
		// Marked by a batch this lane has no record of: it may have
		// been submitted. Never submitted again: its outcome is unknown.
		c.held[key] = h
		c.fin.unknown(ctx, h, "marked in batch "+strings.TrimPrefix(op.Sent.By, markPrefix)+", which has no record")
		return
	}
	c.held[key] = h
	if len(c.pending) == 0 {
		c.since = now
	}
	c.pending = append(c.pending, key)
}

// keepAlive tells NATS the held messages are in progress, each a third of
// the ack wait after the last time.
func (c *gatherer) keepAlive() {
	now := c.now()
	for _, h := range c.held {
		if now.Sub(h.progress) >= c.ackWait/3 {
			_ = h.msg.InProgress()
			h.progress = now
		}
	}
}

// markPrefix starts the Sent mark's By of a job submitted in a batch:
// lane:<local id>.
const markPrefix = "lane:"
