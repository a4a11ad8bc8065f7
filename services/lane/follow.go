package lane

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/streams"
)

// resultOf is one line's end as the provider reported it.
type resultOf = provider.BatchResult

// follower owns an open batch's course once its record is written: a
// create whose outcome is unknown resolved, the batch polled, rescued
// (cancelled) before its earliest deadline, and its lines mapped back
// once it ended.
type follower struct {
	*env
	jobs   *gatherer
	sub    *submitter
	recs   *records
	budget *laneBudget
	fin    *finisher
}

// follow polls each open batch every poll: a batch still submitting is
// resolved, one that ended has its results mapped back, and one not done
// rescue before its earliest deadline is cancelled first.
func (c *follower) follow(ctx context.Context) {
	now := c.now()
	for _, o := range c.recs.batches {
		switch {
		case o.rec.State == stateSubmitting || o.rec.State == stateCalling:
			c.resolveSubmitting(ctx, o)
		case o.rec.State == stateEnded:
			c.mapBack(ctx, o)
		case now.Sub(o.lastPoll) >= c.lane.Poll.D():
			o.lastPoll = now
			c.poll(ctx, o, now)
		}
	}
}

// poll reads a running batch's status and acts on it. A batch due for
// rescue is asked to cancel once; the polls that follow wait, without
// blocking the lane, until the cancellation has finished (what
// provider.CancelAndWait does), and only the ended batch is mapped back.
func (c *follower) poll(ctx context.Context, o *open, now time.Time) {
	b, err := c.client.Status(ctx, o.rec.BatchID)
	if err != nil {
		c.log.Warn("lane: batch status unreadable", "provider", c.provider, "model", c.model, "batch", o.rec.BatchID, "err", err)
		return
	}
	if b.State == provider.BatchRunning && !o.cancelled && o.rec.Earliest != nil && !now.Before(o.rec.Earliest.Add(-c.lane.Rescue.D())) {
		c.log.Info("lane: rescuing batch before its earliest deadline", "provider", c.provider, "model", c.model, "batch", b.ID, "earliest", o.rec.Earliest)
		if _, err := c.client.Cancel(ctx, o.rec.BatchID); err != nil {
			// One that ended meanwhile cannot be cancelled: the next
			// poll sees it ended.
			c.log.Warn("lane: batch cancel refused", "batch", o.rec.BatchID, "err", err)
		}
		o.cancelled = true
		c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "rescued").Inc()
		return
	}
	switch b.State {
	case provider.BatchFailed:
		if errors.Is(b.Err, provider.ErrEnqueuedTokenLimit) {
			c.sub.refused(ctx, o)
			return
		}
		c.log.Warn("lane: batch failed; its jobs go to the normal lane", "provider", c.provider, "model", c.model, "batch", b.ID, "err", b.Err)
		c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "failed").Inc()
		c.sub.unwind(ctx, o, false)
	case provider.BatchEnded:
		c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "ended").Inc()
		_ = c.budget.release(ctx, o.rec.ID)
		o.rec.State = stateEnded
		if err := c.recs.put(ctx, o); err != nil {
			c.log.Warn("lane: batch record not updated", "batch", b.ID, "err", err)
		}
		c.mapBack(ctx, o)
	}
}

// mapBack reads an ended batch's results (once) and ends each line whose
// job this process holds: every line's end decided and recorded first (one
// write), then acted on; the batch's record goes once every line is done.
func (c *follower) mapBack(ctx context.Context, o *open) {
	if o.results == nil {
		rs, err := c.client.Results(ctx, o.rec.BatchID)
		if err != nil {
			c.log.Warn("lane: batch results unreadable", "batch", o.rec.BatchID, "err", err)
			return
		}
		o.results = map[string]resultOf{}
		for _, r := range rs {
			o.results[r.CustomID] = r
		}
	}
	if !c.decideAll(ctx, o) {
		return
	}
	changed, left, n := false, 0, 0
	for id, l := range o.rec.Lines {
		if l.Done {
			continue
		}
		if n++; n%50 == 0 && !c.lease.held(ctx) {
			return // the lane is another's now: it carries on from the record
		}
		h, ok := c.jobs.held[keyOf(l)]
		switch {
		case !ok && l.Res != "" && c.acked(ctx, l.Seq):
			l.Done, changed = true, true // acted on and acknowledged before a restart
		case ok && l.Res != "" && c.fin.end(ctx, o, h, l, o.results[id]):
			l.Done, changed = true, true
			delete(c.jobs.held, keyOf(l))
		default:
			left++ // its message comes back by redelivery, or acting failed
		}
	}
	if left == 0 {
		if err := c.recs.drop(ctx, o); err != nil {
			c.log.Warn("lane: batch record not deleted", "batch", o.rec.BatchID, "err", err)
		}
	} else if changed {
		_ = c.recs.put(ctx, o)
	}
}

// decideAll decides the end of every line whose job is held and records
// them in one write; false when the write failed (nothing is acted on).
func (c *follower) decideAll(ctx context.Context, o *open) bool {
	var decided []*line
	for id, l := range o.rec.Lines {
		if h, ok := c.jobs.held[keyOf(l)]; ok && !l.Done && l.Res == "" {
			l.Res = c.fin.decide(h, o.results[id])
			decided = append(decided, l)
		}
	}
	if len(decided) == 0 {
		return true
	}
	if err := c.recs.put(ctx, o); err != nil {
		c.log.Warn("lane: batch record not updated", "batch", o.rec.BatchID, "err", err)
		for _, l := range decided {
			l.Res = ""
		}
		return false
	}
	return true
}

// acked reports whether the LANE message at seq is gone (acknowledged).
func (c *follower) acked(ctx context.Context, seq uint64) bool {
	st, err := c.m.JS.Stream(ctx, streams.Lane)
	if err != nil {
		return false
	}
	_, err = st.GetMsg(ctx, seq)
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

// resolveSubmitting settles a batch whose submission's outcome is not
// known. Still submitting (this process lost before its create call), it
// never started: its jobs are collected again. Calling (the create's
// answer lost, or this process lost during it), a provider that finds batches by key (OpenAI, Azure: metadata)
// is asked: found, the batch is followed; not found, it never started and
// its jobs are collected again. With Anthropic, whose batches carry no
// metadata, the jobs end outcome_unknown, as a synchronous call's whose
// outcome is unknown do.
func (c *follower) resolveSubmitting(ctx context.Context, o *open) {
	if o.rec.State == stateSubmitting {
		c.sub.unwind(ctx, o, true)
		return
	}
	if f, ok := c.client.(provider.BatchFinder); ok {
		b, found, err := f.Find(ctx, o.rec.ID)
		if err != nil {
			c.log.Warn("lane: looking for a batch by its key failed; retrying", "local_id", o.rec.ID, "err", err)
			return
		}
		if found {
			c.sub.started(ctx, o, b)
			return
		}
		c.sub.unwind(ctx, o, true)
		return
	}
	c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "unknown").Inc()
	o.rec.State, o.results = stateEnded, map[string]resultOf{}
	for _, l := range o.rec.Lines {
		if l.Res == "" {
			l.Res = resUnknown
		}
	}
	if err := c.recs.put(ctx, o); err != nil {
		return
	}
	_ = c.budget.release(ctx, o.rec.ID)
	c.mapBack(ctx, o)
}
