package config

import (
	"fmt"
	"time"
)

// BatchLane is a model's batch lane (providers[].models[].batch): jobs of
// priority batch that can wait go to the provider's Batch API at its batch
// price instead of the synchronous lane (services/lane; docs/CONFIG.md,
// "The batch lane").
type BatchLane struct {
	Enabled bool `yaml:"enabled"`
	// Collect is how long a model's lane jobs are gathered before one
	// batch is sent (fewer when MaxLines fill first).
	Collect Duration `yaml:"collect"`
	// MinDeadline: a job whose deadline is nearer than this never takes
	// the lane (no deadline: it may).
	MinDeadline Duration `yaml:"min_deadline"`
	// Rescue: a batch not ended this long before the earliest deadline it
	// holds is cancelled and what it did not finish runs synchronously.
	Rescue Duration `yaml:"rescue"`
	// Poll is how often an open batch's status is read.
	Poll Duration `yaml:"poll"`
	// MaxLines bounds one batch (below the provider's own limit: the
	// batch record in KV lists every line).
	MaxLines int `yaml:"max_lines"`
	// EnqueuedTokens is OpenAI's enqueued-token limit for the model
	// (prompt tokens of its batches not yet ended); QueueRequests is
	// Anthropic's processing-queue limit (requests not yet answered). Both
	// are budgets: reserved when a batch is submitted, released when it
	// ends, never exceeded (0: no limit).
	EnqueuedTokens int64 `yaml:"enqueued_tokens"`
	QueueRequests  int   `yaml:"queue_requests"`
}

// Batch lane defaults and bounds.
const (
	DefaultBatchCollect     = 30 * time.Second
	DefaultBatchMinDeadline = time.Hour
	DefaultBatchRescue      = 10 * time.Minute
	DefaultBatchPoll        = 30 * time.Second
	DefaultBatchMaxLines    = 5000
	maxBatchLines           = 50_000
)

// Lane returns the model's batch lane with its defaults, and whether it is
// enabled.
func (m Model) Lane() (BatchLane, bool) {
	if m.Batch == nil || !m.Batch.Enabled {
		return BatchLane{}, false
	}
	b := *m.Batch
	for _, d := range []struct {
		v   *Duration
		def time.Duration
	}{{&b.Collect, DefaultBatchCollect}, {&b.MinDeadline, DefaultBatchMinDeadline}, {&b.Rescue, DefaultBatchRescue}, {&b.Poll, DefaultBatchPoll}} {
		if *d.v == 0 {
			*d.v = Duration(d.def)
		}
	}
	if b.MaxLines == 0 {
		b.MaxLines = DefaultBatchMaxLines
	}
	return b, true
}

// checkBatch checks providers[].models[].batch.
func (c *Config) checkBatch(fail failFunc) {
	for i, p := range c.Providers {
		for j, m := range p.Models {
			b := m.Batch
			if b == nil {
				continue
			}
			key := fmt.Sprintf("providers[%d].models[%d].batch", i, j)
			for _, d := range []struct {
				name     string
				v        Duration
				min, max time.Duration
			}{{"collect", b.Collect, 0, time.Hour}, {"min_deadline", b.MinDeadline, 0, 24 * time.Hour},
				{"rescue", b.Rescue, 0, 24 * time.Hour}, {"poll", b.Poll, 0, 10 * time.Minute}} {
				if d.v.D() < d.min || d.v.D() > d.max {
					fail(key+"."+d.name, "must be between %s and %s, got %s", d.min, d.max, d.v.D())
				}
			}
			if b.MaxLines < 0 || b.MaxLines > maxBatchLines {
				fail(key+".max_lines", "must be between 0 (default %d) and %d, got %d", DefaultBatchMaxLines, maxBatchLines, b.MaxLines)
			}
			if b.EnqueuedTokens < 0 {
				fail(key+".enqueued_tokens", "must be 0 (no limit) or more, got %d", b.EnqueuedTokens)
			}
			if b.QueueRequests < 0 {
				fail(key+".queue_requests", "must be 0 (no limit) or more, got %d", b.QueueRequests)
			}
			if l, ok := m.Lane(); ok && l.Rescue.D() >= l.MinDeadline.D() {
				fail(key+".rescue", "must be shorter than min_deadline (%s), or a job could take the lane already due for rescue, got %s", l.MinDeadline.D(), l.Rescue.D())
			}
		}
	}
}
