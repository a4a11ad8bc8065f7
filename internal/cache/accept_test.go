package cache_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/sim"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const model = "gpt-4o-mini"

var env = map[string]string{"SIM_KEY": "sim-secret", "ACME_KEY": "acme-key", "GLOBEX_KEY": "globex-key"}

func getenv(k string) string { return env[k] }

// ledger counts the calls the simulated provider admitted, by the tag
// each test writes into its prompt, and holds the calls of the tags a test
// holds until it releases them.
type ledger struct {
	mu      sync.Mutex
	calls   map[string]int
	arrived map[string]int
	held    map[string]chan struct{}
}

// tagOf reads the tag of a chat body's prompt ("<tag>: text").
func tagOf(body []byte) string {
	var b struct {
		Messages []struct {
			Content any `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &b)
	for _, m := range b.Messages {
		if s, ok := m.Content.(string); ok {
			if tag, _, ok := strings.Cut(s, ":"); ok {
				return tag
			}
		}
	}
	return ""
}

func (l *ledger) arrival(a sim.Arrival) {
	if !a.Admitted {
		return
	}
	if tag := tagOf(a.Body); tag != "" {
		l.mu.Lock()
		l.calls[tag]++
		l.mu.Unlock()
	}
}

func (l *ledger) count(tag string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[tag]
}

// hold keeps the provider from answering tag's calls until release: they
// arrive (arrivedAt counts them) and wait, however slow the machine.
func (l *ledger) hold(tag string) (release func()) {
	ch := make(chan struct{})
	l.mu.Lock()
	l.held[tag] = ch
	l.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (l *ledger) arrivedAt(tag string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.arrived[tag]
}

// gate is the provider's front: it counts arrivals and holds what is held.
func (l *ledger) gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		tag := tagOf(body)
		l.mu.Lock()
		l.arrived[tag]++
		ch := l.held[tag]
		l.mu.Unlock()
		if ch != nil {
			select {
			case <-ch:
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// startSim runs the simulated provider; every prompt of these tests is
// "<tag>: text", and the ledger counts the provider's calls per tag.
func startSim(t *testing.T, cfg sim.Config) (*ledger, string) {
	t.Helper()
	l := &ledger{calls: map[string]int{}, arrived: map[string]int{}, held: map[string]chan struct{}{}}
	cfg.Models = []sim.ModelLimits{{Name: model, RPM: 100000, TPM: 10000000}}
	cfg.APIKeys = []string{"sim-secret"}
	cfg.OnArrival = l.arrival
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(l.gate(s))
	t.Cleanup(ts.Close)
	return l, ts.URL
}

func testConfig(t *testing.T, simURL, extra string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: 100000, tpm: 10000000, max_concurrency: 64}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
%s`, simURL, model, extra)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startNode runs a node until the test ends (or stop is called): with
// natsURL "" it embeds a server storing under data.
func startNode(t *testing.T, cfg *config.Config, natsURL, data string) (node.Info, func()) {
	t.Helper()
	ready := make(chan node.Info, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := node.Options{Config: cfg, NATSURL: natsURL, Data: data, HTTP: "127.0.0.1:0", Getenv: getenv,
		OnReady: func(i node.Info) { ready <- i }}
	if natsURL == "" {
		o.NATSListen = "127.0.0.1:0"
	}
	if os.Getenv("CACHE_DEBUG") != "" {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	go func() { done <- node.Run(ctx, o) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case info := <-ready:
		return info, stop
	case err := <-done:
		done <- err
		t.Fatalf("node did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("node not ready after 30s")
	}
	return node.Info{}, stop
}

// subCtx bounds one subtest's requests.
func subCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sdk(info node.Info, key string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL("http://" + info.HTTPAddr + "/v1"), option.WithAPIKey(key), option.WithMaxRetries(0)}, opts...)...)
}

func params(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(maxTokens), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

var cacheable = option.WithHeader("Cache-Control", "max-age=300")

type answer struct {
	text, id, cache, age string
	finish               string
	err                  error
}

func ask(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) answer {
	var resp *http.Response
	r, err := c.Chat.Completions.New(ctx, p, append(opts, option.WithResponseInto(&resp))...)
	if err != nil {
		return answer{err: err}
	}
	a := answer{id: r.ID, cache: resp.Header.Get("X-Sluice-Cache"), age: resp.Header.Get("Age")}
	if len(r.Choices) > 0 {
		a.text, a.finish = r.Choices[0].Message.Content, r.Choices[0].FinishReason
	}
	return a
}

func askStream(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) answer {
	var resp *http.Response
	st := c.Chat.Completions.NewStreaming(ctx, p, append(opts, option.WithResponseInto(&resp))...)
	defer st.Close()
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		return answer{err: err}
	}
	a := answer{id: acc.ID, cache: resp.Header.Get("X-Sluice-Cache"), age: resp.Header.Get("Age")}
	if len(acc.Choices) > 0 {
		a.text, a.finish = acc.Choices[0].Message.Content, acc.Choices[0].FinishReason
	}
	return a
}

// metric sums a counter's samples whose labels include want.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == k && lp.GetValue() == v)
				}
				if !found {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestCacheOpenAI goes through one node with the official OpenAI SDK:
// concurrent identical cacheable requests make one call, a stream after
// them is a hit replayed as SSE, and what must not be cached is not.
func TestCacheOpenAI(t *testing.T) {
	if testing.Short() {
		t.Skip("entries expiring in real time, about 10 s: the full tier runs it, not -short")
	}
	t.Parallel()
	l, simURL := startSim(t, sim.Config{TTFT: 300 * time.Millisecond})
	info, _ := startNode(t, testConfig(t, simURL, ""), "", t.TempDir())
	acme, globex := sdk(info, "acme-key"), sdk(info, "globex-key")

	t.Run("50 concurrent, then a stream", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("fifty: classify this text", 64)
		const n = 50
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = ask(ctx, acme, p, cacheable) })
		}
		wg.Wait()
		for i, a := range answers {
			if a.err != nil {
				t.Fatalf("request %d: %v", i, a.err)
			}
			if a.text != answers[0].text || a.id != answers[0].id {
				t.Fatalf("request %d answered %q (%s), request 0 %q (%s): want one answer", i, a.text, a.id, answers[0].text, answers[0].id)
			}
			if a.cache != "MISS" && a.cache != "HIT" {
				t.Errorf("request %d: X-Sluice-Cache %q, want MISS or HIT", i, a.cache)
			}
		}
		if got := l.count("fifty"); got != 1 {
			t.Fatalf("%d identical cacheable requests made %d provider calls, want 1", n, got)
		}
		if answers[0].finish != "stop" {
			t.Fatalf("finish_reason %q: the test needs a complete answer", answers[0].finish)
		}
		s := askStream(ctx, acme, p, cacheable)
		if s.err != nil || s.cache != "HIT" || s.text != answers[0].text || s.finish != "stop" || s.age == "" {
			t.Fatalf("the same request streamed: %q finish %q cache %q age %q err %v; want the stored answer, a HIT with an Age", s.text, s.finish, s.cache, s.age, s.err)
		}
		if got := l.count("fifty"); got != 1 {
			t.Errorf("provider calls %d after the hit, want 1", got)
		}
		if hits := metric(t, info.Registry, "sluice_cache_requests_total", map[string]string{"result": "hit"}); hits < 1 {
			t.Errorf("sluice_cache_requests_total{result=hit} = %v", hits)
		}
		if saved := metric(t, info.Registry, "sluice_cache_tokens_saved_total", nil); saved <= 0 {
			t.Errorf("sluice_cache_tokens_saved_total = %v, want the hit's and the joiners' tokens", saved)
		}
		// Another tenant never sees acme's entry.
		g := ask(ctx, globex, p, cacheable)
		if g.err != nil || g.cache != "MISS" {
			t.Fatalf("globex: cache %q err %v, want a MISS", g.cache, g.err)
		}
		if got := l.count("fifty"); got != 2 {
			t.Errorf("provider calls %d after another tenant's request, want 2 (its own)", got)
		}
	})

	t.Run("not deterministic", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("nondet: write a poem", 64)
		p.Temperature = openai.Float(0.7)
		for range 2 {
			if a := ask(ctx, acme, p, cacheable); a.err != nil || a.cache != "BYPASS" {
				t.Fatalf("cache %q err %v, want BYPASS", a.cache, a.err)
			}
		}
		p2 := params("notemp: write a poem", 64)
		p2.Temperature = param.Opt[float64]{}
		for range 2 {
			if a := ask(ctx, acme, p2, cacheable); a.err != nil || a.cache != "BYPASS" {
				t.Fatalf("no temperature: cache %q err %v, want BYPASS", a.cache, a.err)
			}
		}
		if a, b := l.count("nondet"), l.count("notemp"); a != 2 || b != 2 {
			t.Errorf("provider calls %d and %d, want 2 each: not cached", a, b)
		}
		// A seed makes it cacheable; so does X-Sluice-Cache: force.
		p3 := params("seeded: write a poem", 64)
		p3.Temperature, p3.Seed = openai.Float(1), openai.Int(7)
		p4 := params("forced: write a poem", 64)
		p4.Temperature = openai.Float(1)
		for range 2 {
			if a := ask(ctx, acme, p3, cacheable); a.err != nil {
				t.Fatal(a.err)
			}
			if a := ask(ctx, acme, p4, cacheable, option.WithHeader("X-Sluice-Cache", "force")); a.err != nil {
				t.Fatal(a.err)
			}
		}
		if a, b := l.count("seeded"), l.count("forced"); a != 1 || b != 1 {
			t.Errorf("seeded: %d calls, forced: %d calls, want 1 each", a, b)
		}
	})

	t.Run("not asked", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("unasked: classify", 64)
		for range 2 {
			if a := ask(ctx, acme, p); a.err != nil || a.cache != "" {
				t.Fatalf("cache %q err %v, want no header", a.cache, a.err)
			}
		}
		if got := l.count("unasked"); got != 2 {
			t.Errorf("provider calls %d, want 2", got)
		}
	})

	t.Run("truncated", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("short: classify this text at length", 1)
		for range 2 {
			a := ask(ctx, acme, p, cacheable)
			if a.err != nil || a.finish != "length" {
				t.Fatalf("finish %q err %v, want length", a.finish, a.err)
			}
		}
		if got := l.count("short"); got != 2 {
			t.Errorf("provider calls %d, want 2: a truncated answer is not stored", got)
		}
	})

	t.Run("no-cache and no-store", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("nocache: classify", 64)
		if a := ask(ctx, acme, p, cacheable); a.err != nil {
			t.Fatal(a.err)
		}
		a := ask(ctx, acme, p, option.WithHeader("Cache-Control", "max-age=300, no-cache"))
		if a.err != nil || a.cache != "BYPASS" {
			t.Fatalf("no-cache: cache %q err %v, want BYPASS", a.cache, a.err)
		}
		if got := l.count("nocache"); got != 2 {
			t.Errorf("provider calls %d, want 2: no-cache skips the read", got)
		}
		p2 := params("nostore: classify", 64)
		for range 2 {
			if a := ask(ctx, acme, p2, option.WithHeader("Cache-Control", "max-age=300, no-store")); a.err != nil || a.cache != "MISS" {
				t.Fatalf("no-store: cache %q err %v, want MISS", a.cache, a.err)
			}
		}
		if got := l.count("nostore"); got != 2 {
			t.Errorf("provider calls %d, want 2: no-store skips the write", got)
		}
	})

	t.Run("ttl", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("ttl: classify", 64)
		if a := ask(ctx, acme, p, option.WithHeader("Cache-Control", "max-age=1")); a.err != nil || a.cache != "MISS" {
			t.Fatalf("cache %q err %v", a.cache, a.err)
		}
		// Hits until the entry expires, then a call of its own.
		natstest.Eventually(t, 15*time.Second, func() error {
			if l.count("ttl") >= 2 {
				return nil
			}
			if a := ask(ctx, acme, p, option.WithHeader("Cache-Control", "max-age=1")); a.err != nil {
				t.Fatal(a.err)
			}
			return errors.New("the entry never expired")
		})
		if got := l.count("ttl"); got != 2 {
			t.Errorf("provider calls %d, want 2", got)
		}
	})

	t.Run("envelope", func(t *testing.T) {
		ctx := subCtx(t)
		// POST /v1/jobs: the envelope's cache member asks; the second job
		// is answered from the first one's entry.
		body := fmt.Sprintf(`{"cache":{"ttl":300},"request":{"model":%q,"temperature":0,"max_tokens":64,"messages":[{"role":"user","content":"envelope: classify"}]}}`, model)
		var texts []string
		for range 2 {
			id := postJob(ctx, t, info, body)
			texts = append(texts, jobText(ctx, t, info, id))
		}
		if texts[0] == "" || texts[0] != texts[1] {
			t.Errorf("answers %q, want one answer twice", texts)
		}
		if got := l.count("envelope"); got != 1 {
			t.Errorf("provider calls %d, want 1", got)
		}
	})

	t.Run("anthropic", func(t *testing.T) {
		ctx := subCtx(t)
		c := anthropic.NewClient(aoption.WithBaseURL("http://"+info.HTTPAddr+"/"), aoption.WithAPIKey("acme-key"), aoption.WithMaxRetries(0),
			aoption.WithHeader("Cache-Control", "max-age=300"))
		// The SDK has no temperature field any more; the API still takes it.
		t0 := aoption.WithJSONSet("temperature", 0)
		p := anthropic.MessageNewParams{Model: model, MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("messages: classify this"))}}
		const n = 10
		msgs := make([]*anthropic.Message, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range msgs {
			wg.Go(func() { msgs[i], errs[i] = c.Messages.New(ctx, p, t0) })
		}
		wg.Wait()
		for i := range msgs {
			if errs[i] != nil {
				t.Fatalf("message %d: %v", i, errs[i])
			}
			if msgs[i].Content[0].Text != msgs[0].Content[0].Text {
				t.Fatalf("message %d differs from message 0", i)
			}
		}
		if got := l.count("messages"); got != 1 {
			t.Fatalf("%d identical cacheable messages made %d calls, want 1", n, got)
		}
		var resp *http.Response
		st := c.Messages.NewStreaming(ctx, p, t0, aoption.WithResponseInto(&resp))
		var msg anthropic.Message
		for st.Next() {
			if err := msg.Accumulate(st.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("streamed hit: %v", err)
		}
		if resp.Header.Get("X-Sluice-Cache") != "HIT" || len(msg.Content) != 1 || msg.Content[0].Text != msgs[0].Content[0].Text || msg.StopReason != anthropic.StopReasonEndTurn {
			t.Errorf("streamed: cache %q content %+v stop %q, want a HIT replaying the stored message", resp.Header.Get("X-Sluice-Cache"), msg.Content, msg.StopReason)
		}
		if got := l.count("messages"); got != 1 {
			t.Errorf("calls %d after the streamed hit, want 1", got)
		}
		p.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("msgnotemp: classify this"))}
		for range 2 {
			if _, err := c.Messages.New(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		if got := l.count("msgnotemp"); got != 2 {
			t.Errorf("no temperature: %d calls, want 2", got)
		}
	})
}

// TestCacheInterruptedNotStored: a stream the provider cuts after its
// first tokens ends interrupted, and is not stored.
func TestCacheInterruptedNotStored(t *testing.T) {
	t.Parallel()
	l, simURL := startSim(t, sim.Config{Faults: sim.Faults{RateStreamCut: 1, StreamCutAfter: 2}})
	info, _ := startNode(t, testConfig(t, simURL, ""), "", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := sdk(info, "acme-key")
	p := params("cut: tell a long story", 64)
	for range 2 {
		if a := askStream(ctx, c, p, cacheable); a.err == nil {
			t.Fatalf("the stream ended well (%q); the test needs it cut", a.text)
		}
	}
	if got := l.count("cut"); got != 2 {
		t.Errorf("provider calls %d, want 2: an interrupted answer is not stored", got)
	}
}

// TestCacheSurvivesRestart: an entry outlives every process.
func TestCacheSurvivesRestart(t *testing.T) {
	t.Parallel()
	l, simURL := startSim(t, sim.Config{})
	cfg := testConfig(t, simURL, "")
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info, stop := startNode(t, cfg, "", data)
	p := params("restart: classify", 64)
	first := ask(ctx, sdk(info, "acme-key"), p, cacheable)
	if first.err != nil || first.cache != "MISS" {
		t.Fatalf("cache %q err %v", first.cache, first.err)
	}
	stop()
	info, _ = startNode(t, cfg, "", data)
	again := ask(ctx, sdk(info, "acme-key"), p, cacheable)
	if again.err != nil || again.cache != "HIT" || again.text != first.text {
		t.Fatalf("after the restart: cache %q err %v; want a HIT with the same answer", again.cache, again.err)
	}
	if got := l.count("restart"); got != 1 {
		t.Errorf("provider calls %d, want 1", got)
	}
}

// TestCoalesceAcrossProcesses runs two nodes (every service in each) on
// one NATS server: identical requests split between them make one call,
// and neither a follower's nor the leader's disconnect stops the others'
// answers. The provider holds each call until the test releases it, so
// the call is in flight while requests join, however slow the machine.
func TestCoalesceAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("nodes in several processes, about 15 s: the full tier runs it, not -short")
	}
	t.Parallel()
	l, simURL := startSim(t, sim.Config{})
	ns := natstest.Server(t)
	cfg := testConfig(t, simURL, "")
	a, _ := startNode(t, cfg, ns.ClientURL(), "")
	b, _ := startNode(t, cfg, ns.ClientURL(), "")
	nodes := []node.Info{a, b}
	coalesced := func() int {
		return int(metric(t, a.Registry, "sluice_cache_coalesced_total", nil) + metric(t, b.Registry, "sluice_cache_coalesced_total", nil))
	}

	t.Run("split", func(t *testing.T) {
		ctx := subCtx(t)
		p := params("split: classify", 64)
		release := l.hold("split")
		defer release()
		base := coalesced()
		const n = 20
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = ask(ctx, sdk(nodes[i%2], "acme-key"), p, cacheable) })
		}
		// Each request either joined the call or made its own.
		natstest.Eventually(t, 30*time.Second, func() error {
			if got := coalesced() - base + l.arrivedAt("split"); got < n {
				return fmt.Errorf("%d of %d requests joined or called", got, n)
			}
			return nil
		})
		release()
		wg.Wait()
		for i, ans := range answers {
			if ans.err != nil || ans.text != answers[0].text {
				t.Fatalf("request %d: %q err %v, want request 0's %q", i, ans.text, ans.err, answers[0].text)
			}
		}
		if got := l.count("split"); got != 1 {
			t.Errorf("%d identical requests over two processes made %d calls, want 1", n, got)
		}
	})

	// disconnect starts a leader on node a, followers on node b once the
	// leader's call has reached the provider, and cancels one of them
	// (leader: index 0) once every follower has joined; then the provider
	// answers.
	disconnect := func(t *testing.T, tag string, drop int) {
		ctx := subCtx(t)
		p := params(tag+": classify", 64)
		release := l.hold(tag)
		defer release()
		const followers = 4
		answers := make([]answer, followers+1)
		ctxs := make([]context.Context, followers+1)
		cancels := make([]context.CancelFunc, followers+1)
		for i := range ctxs {
			ctxs[i], cancels[i] = context.WithCancel(ctx)
			defer cancels[i]()
		}
		base := coalesced()
		var wg sync.WaitGroup
		done := make([]chan struct{}, followers+1)
		start := func(i int, n node.Info) {
			done[i] = make(chan struct{})
			wg.Go(func() {
				defer close(done[i])
				answers[i] = askStream(ctxs[i], sdk(n, "acme-key"), p, cacheable)
			})
		}
		start(0, a)
		natstest.Eventually(t, 30*time.Second, func() error {
			if l.arrivedAt(tag) == 0 {
				return errors.New("the leader's call has not reached the provider")
			}
			return nil
		})
		for i := 1; i <= followers; i++ {
			start(i, b)
		}
		natstest.Eventually(t, 30*time.Second, func() error {
			if got := coalesced() - base; got < followers {
				return fmt.Errorf("%d of %d followers joined", got, followers)
			}
			return nil
		})
		cancels[drop]()
		<-done[drop]
		// Time for the node to see the disconnect before the answer comes
		// (net/http notices a closed connection on its own; nothing
		// signals it): on a machine slower than this, the test passes
		// without testing it, never fails for it.
		time.Sleep(500 * time.Millisecond)
		release()
		wg.Wait()
		var want string
		for i, ans := range answers {
			if i == drop {
				if ans.err == nil {
					t.Fatalf("request %d was answered before its cancel", i)
				}
				continue
			}
			if ans.err != nil || ans.finish != "stop" {
				t.Fatalf("request %d: finish %q err %v, want the shared answer", i, ans.finish, ans.err)
			}
			if want == "" {
				want = ans.text
			}
			if ans.text != want {
				t.Errorf("request %d answered differently", i)
			}
		}
		if got := l.count(tag); got != 1 {
			t.Errorf("provider calls %d, want 1", got)
		}
	}
	t.Run("follower disconnects", func(t *testing.T) { disconnect(t, "follower", 2) })
	t.Run("leader disconnects", func(t *testing.T) { disconnect(t, "leader", 0) })
}

func postJob(ctx context.Context, t *testing.T, info node.Info, body string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+info.HTTPAddr+"/v1/jobs", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer acme-key")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs: %d %v", resp.StatusCode, err)
	}
	return out.ID
}

func jobText(ctx context.Context, t *testing.T, info node.Info, id string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+info.HTTPAddr+"/v1/jobs/"+id+"?wait=20s", nil)
	req.Header.Set("Authorization", "Bearer acme-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result struct {
			Response struct {
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			} `json:"response"`
		} `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Result.Response.Choices) == 0 {
		t.Fatalf("GET /v1/jobs/%s: %d %v", id, resp.StatusCode, err)
	}
	return out.Result.Response.Choices[0].Message.Content
}
