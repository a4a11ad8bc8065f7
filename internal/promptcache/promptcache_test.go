package promptcache_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/promptcache"
)

func chat(model, system, ttl, turn string) []byte {
	cc := `{"type":"ephemeral"}`
	if ttl != "" {
		cc = `{"type":"ephemeral","ttl":"` + ttl + `"}`
	}
	return []byte(`{"model":"` + model + `","max_tokens":500,"messages":[` +
		`{"role":"system","content":[{"type":"text","text":"` + system + `","cache_control":` + cc + `}]},` +
		`{"role":"user","content":"` + turn + `"}]}`)
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	sys := strings.Repeat("You are a careful agent. ", 200)
	a, ok := promptcache.Of(chat("claude-x", sys, "", "first turn"))
	if !ok || a.TTL != promptcache.TTLShort || a.Tokens < 1000 || a.Tokens > 1400 {
		t.Fatalf("prefix %+v %v, want a 5-minute prefix of about 1,200 tokens", a, ok)
	}
	for _, tc := range []struct {
		name string
		body []byte
		same bool
	}{
		{"another turn", chat("claude-x", sys, "", "second turn"), true},
		{"another system prompt", chat("claude-x", sys+"!", "", "first turn"), false},
		{"another model", chat("claude-y", sys, "", "first turn"), false},
	} {
		b, ok := promptcache.Of(tc.body)
		if !ok || (b.Hash == a.Hash) != tc.same {
			t.Errorf("%s: hash equal %v, want %v", tc.name, b.Hash == a.Hash, tc.same)
		}
	}
	if p, ok := promptcache.Of(chat("claude-x", sys, "1h", "t")); !ok || p.TTL != promptcache.TTLLong {
		t.Errorf("ttl 1h: %+v", p)
	}
	// A breakpoint on a tool, or on a whole message, counts too; none is no prefix.
	tool := []byte(`{"model":"m","tools":[{"type":"function","function":{"name":"f"},"cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`)
	msg := []byte(`{"model":"m","messages":[{"role":"user","content":"hi","cache_control":{"type":"ephemeral"}},{"role":"user","content":"more"}]}`)
	for name, body := range map[string][]byte{"tool": tool, "message": msg} {
		if _, ok := promptcache.Of(body); !ok {
			t.Errorf("%s breakpoint not found", name)
		}
	}
	for _, body := range []string{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `not json "cache_control"`, `{"messages":7,"cache_control":1}`} {
		if _, ok := promptcache.Of([]byte(body)); ok {
			t.Errorf("%s: a prefix", body)
		}
	}
}

func TestRegistry(t *testing.T) {
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
	clk := fakeclock.New(time.Unix(1_800_000_000, 0))
	writer, reader := promptcache.New(kv, clk.Now), promptcache.New(kv, clk.Now)
	key := promptcache.Key("anthropic", "claude-x")
	if _, warm := reader.Warm(ctx, key, "h1"); warm {
		t.Fatal("warm before any write")
	}
	if err := writer.Record(ctx, key, "h1", 3000, promptcache.TTLShort); err != nil {
		t.Fatal(err)
	}
	clk.Advance(promptcache.Refresh)
	if e, warm := reader.Warm(ctx, key, "h1"); !warm || e.Tokens != 3000 {
		t.Fatalf("after a write: %+v %v, want warm with 3,000 tokens", e, warm)
	}
	clk.Advance(promptcache.TTLShort)
	if _, warm := reader.Warm(ctx, key, "h1"); warm {
		t.Error("warm past its TTL")
	}
	// Bounded: the entries that expire last are kept.
	for i := range promptcache.MaxEntries + 10 {
		clk.Advance(time.Millisecond)
		if err := writer.Record(ctx, key, "many"+string(rune('a'+i%26))+time.Duration(i).String(), 1, promptcache.TTLShort); err != nil {
			t.Fatal(err)
		}
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(e.Value()), `"e":`); n != promptcache.MaxEntries {
		t.Errorf("record holds %d entries, want %d", n, promptcache.MaxEntries)
	}
}
