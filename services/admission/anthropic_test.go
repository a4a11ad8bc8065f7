package admission

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// TestReservationNetOfCache: on a model that limits input and output apart,
// a job whose cacheable prefix the fleet's registry holds warm reserves its
// input net of the prefix (and its output apart); cold, or on a model whose
// cache reads count, the whole prompt.
func TestReservationNetOfCache(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "budgets"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := &coster{env: &env{}, pcache: promptcache.New(kv, clock)}
	body := []byte(`{"model":"claude-x","max_tokens":500,"messages":[{"role":"system","content":[{"type":"text","text":"` +
		strings.Repeat("Plan, then act. ", 750) + `","cache_control":{"type":"ephemeral"}}]},{"role":"user","content":"` + strings.Repeat("turn ", 200) + `"}]}`)
	p, ok := promptcache.Of(body)
	if !ok {
		t.Fatal("no prefix")
	}
	est := job.Estimate{PromptTokens: p.Tokens + 210, MaxTokens: 500}
	ms := &modelState{key: "k", provider: "anthropic", model: "claude-x", rule: budget.Rule{Split: true}}
	cand := func() *Candidate {
		c := &Candidate{Job: &task.Task{Job: job.Job{Request: body}, Estimate: &est}}
		s.place(ms, c)
		return c
	}
	c := cand()
	if c.Cost.Tokens != est.PromptTokens || c.Cost.Output != 500 {
		t.Fatalf("cost %+v, want the prompt as input and max_tokens as output", c.Cost)
	}
	s.netOfCache(ctx, ms, []*Candidate{c})
	if c.Cost.Tokens != est.PromptTokens || c.held.Cached != 0 {
		t.Errorf("cold prefix: input %d cached %d, want the whole prompt", c.Cost.Tokens, c.held.Cached)
	}
	if err := s.pcache.Record(ctx, promptcache.Key("anthropic", job.ModelToken("claude-x")), p.Hash, 3000, p.TTL); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(promptcache.Refresh) // the registry's view is read again
	mu.Unlock()
	c = cand()
	s.netOfCache(ctx, ms, []*Candidate{c})
	if c.Cost.Tokens != 210 || c.held.Cached != p.Tokens || c.Cost.Output != 500 {
		t.Errorf("warm prefix: input %d cached %d output %d, want 210, %d, 500", c.Cost.Tokens, c.held.Cached, c.Cost.Output, p.Tokens)
	}
	ms.rule.CacheReads = true
	c = cand()
	s.netOfCache(ctx, ms, []*Candidate{c})
	if c.Cost.Tokens != est.PromptTokens || c.held.Cached != 0 {
		t.Errorf("cache reads counted: input %d cached %d, want the whole prompt", c.Cost.Tokens, c.held.Cached)
	}
}
