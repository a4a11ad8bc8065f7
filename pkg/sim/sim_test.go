package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

const model = "gpt-4o-mini"

func newClock() *fakeclock.Clock { return fakeclock.New(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)) }

// start runs a simulator on a loopback HTTP server. Unless the test names a
// count, the simulator counts prompts with package tokens: these tests
// check how limits are enforced, with costs they compute the same way;
// count_test.go checks the simulator's own count.
func start(t *testing.T, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	if cfg.Count.Mode == "" {
		cfg.Count.Mode = sim.CountSluice
	}
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts.URL
}

func body(model, prompt string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens,
	})
	return string(b)
}

// cost is what the simulator charges for a body: prompt + max output.
func cost(t *testing.T, b string) int {
	t.Helper()
	req, err := job.ParseRequest([]byte(b), job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return tokens.Prompt(req) + req.OutputLimit(sim.DefaultMaxTokens)
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("status %d: body %q: %v", r.status, r.body, err)
	}
	return m
}

// apiErr returns the "error" object of an error reply.
func (r reply) apiErr(t *testing.T) map[string]any {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("status %d: no error object in %s", r.status, r.body)
	}
	return e
}

func do(t *testing.T, method, url, payload string, hdr ...string) reply {
	t.Helper()
	r, err := try(context.Background(), method, url, payload, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func try(ctx context.Context, method, url, payload string, hdr ...string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(payload))
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func chat(t *testing.T, url, payload string, hdr ...string) reply {
	t.Helper()
	return do(t, http.MethodPost, url+"/v1/chat/completions", payload, hdr...)
}

func wantStatus(t *testing.T, r reply, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
}

func wantHeader(t *testing.T, r reply, name, want string) {
	t.Helper()
	if got := r.header.Get(name); got != want {
		t.Errorf("header %s = %q, want %q", name, got, want)
	}
}

func TestCompletionWithinLimits(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 100, TPM: 100_000}}})
	const prompt = "Summarise the plot of Hamlet in one sentence, please."
	b := body(model, prompt, 200)
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusOK)

	var got struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			TotalTokens         int `json:"total_tokens"`
			PromptTokensDetails struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	wantPrompt := cost(t, b) - 200
	switch {
	case !strings.HasPrefix(got.ID, "chatcmpl-") || len(got.ID) < 20:
		t.Errorf("id %q", got.ID)
	case got.Object != "chat.completion" || got.Model != model || got.Created == 0:
		t.Errorf("object %q model %q created %d", got.Object, got.Model, got.Created)
	case len(got.Choices) != 1 || got.Choices[0].Message.Role != "assistant" || got.Choices[0].FinishReason != "stop":
		t.Errorf("choices %+v", got.Choices)
	case got.Choices[0].Message.Content == "" || strings.Contains(got.Choices[0].Message.Content, "Hamlet"):
		t.Errorf("content %q: want filler that does not echo the prompt", got.Choices[0].Message.Content)
	case got.Usage.PromptTokens != wantPrompt:
		t.Errorf("prompt tokens %d, want %d", got.Usage.PromptTokens, wantPrompt)
	case got.Usage.CompletionTokens < 50 || got.Usage.CompletionTokens > 100:
		t.Errorf("completion tokens %d, want in [50, 100]", got.Usage.CompletionTokens)
	case got.Usage.TotalTokens != got.Usage.PromptTokens+got.Usage.CompletionTokens:
		t.Errorf("total tokens %d", got.Usage.TotalTokens)
	case got.Usage.PromptTokensDetails.CachedTokens == nil || *got.Usage.PromptTokensDetails.CachedTokens != 0:
		t.Errorf("cached tokens missing")
	}
	wantHeader(t, r, "x-ratelimit-limit-requests", "100")
	wantHeader(t, r, "x-ratelimit-remaining-requests", "99")
	wantHeader(t, r, "x-ratelimit-limit-tokens", "100000")
	wantHeader(t, r, "x-ratelimit-remaining-tokens", strconv.Itoa(100_000-cost(t, b)))
	wantHeader(t, r, "x-ratelimit-reset-requests", "1m0s")

	// The same body always gets the same completion length.
	var again struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(chat(t, url, b).body, &again)
	if again.Usage.CompletionTokens != got.Usage.CompletionTokens {
		t.Errorf("completion tokens %d then %d for the same body", got.Usage.CompletionTokens, again.Usage.CompletionTokens)
	}
	st := s.Stats()
	ms := st.Models[model]
	if st.Completed != 2 || st.Requests[200] != 2 || ms.SuccessRequests != 2 || ms.ChargedTokens != int64(2*cost(t, b)) ||
		ms.SuccessTokens != int64(2*got.Usage.TotalTokens) {
		t.Errorf("stats %+v, model %+v", st, ms)
	}
}

func TestOpenAIClientCompatible(t *testing.T) {
	t.Parallel()
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1}}, BurstFraction: 1, APIKeys: []string{"sk-test"}})
	client := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens: openai.Int(40),
	}
	cc, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if cc.Choices[0].Message.Content == "" || cc.Usage.TotalTokens != cc.Usage.PromptTokens+cc.Usage.CompletionTokens {
		t.Errorf("completion %+v", cc)
	}
	_, err = client.Chat.Completions.New(context.Background(), params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "rate_limit_exceeded" || apiErr.Type != "requests" {
		t.Fatalf("second call: %v", err)
	}
}

func TestRPMExceeded(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 3}}, BurstFraction: 1, Now: clk.Now})
	b := body(model, "hi", 10)
	for range 3 {
		wantStatus(t, chat(t, url, b), http.StatusOK)
		clk.Advance(time.Second)
	}
	clk.Advance(7 * time.Second) // t0+10s
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests)
	e := r.apiErr(t)
	if e["type"] != "requests" || e["code"] != "rate_limit_exceeded" || e["param"] != nil {
		t.Errorf("error %v", e)
	}
	// The rejection counts: 4 requests in the window, so the two oldest
	// (t0, t0+1s) must expire: the request fits at t0+61s, 51 s from now.
	msg, _ := e["message"].(string)
	for _, want := range []string{"Rate limit reached for " + model, "requests per min (RPM): Limit 3, Used 3, Requested 1.", "Please try again in 51s."} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	wantHeader(t, r, "Retry-After", "51")
	wantHeader(t, r, "retry-after-ms", "51000")
	wantHeader(t, r, "x-ratelimit-limit-requests", "3")
	wantHeader(t, r, "x-ratelimit-remaining-requests", "0")
	wantHeader(t, r, "x-ratelimit-reset-requests", "1m0s")
	if r.header.Get("x-ratelimit-limit-tokens") != "" {
		t.Errorf("token headers on a model without TPM")
	}

	clk.Advance(51*time.Second - time.Millisecond)
	wantStatus(t, chat(t, url, b), http.StatusTooManyRequests) // a millisecond early (and counted)
	clk.Advance(time.Millisecond)
	r = chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests) // ... which pushed the fit back by one slot
	retry, _ := strconv.Atoi(r.header.Get("retry-after-ms"))
	clk.Advance(time.Duration(retry) * time.Millisecond)
	wantStatus(t, chat(t, url, b), http.StatusOK)

	ms := s.Stats().Models[model]
	if ms.Admitted != 4 || ms.RateLimited != 3 || ms.MaxAdmittedRequestsIn60s != 3 || ms.MaxRequestsIn60s != 4 {
		t.Errorf("model stats %+v", ms)
	}
}

func TestRejectedRequestsCountTowardRPM(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 2}}, BurstFraction: 1, Now: clk.Now})
	b := body(model, "hi", 10)
	wantStatus(t, chat(t, url, b), http.StatusOK)
	wantStatus(t, chat(t, url, b), http.StatusOK)
	clk.Advance(30 * time.Second)
	wantStatus(t, chat(t, url, b), http.StatusTooManyRequests)
	clk.Advance(30 * time.Second) // the two admitted ones left the window; the rejected one did not
	wantStatus(t, chat(t, url, b), http.StatusOK)
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests)
	if !strings.Contains(r.apiErr(t)["message"].(string), "Used 2") {
		t.Errorf("message %q: want the rejected request counted", r.apiErr(t)["message"])
	}
	ms := s.Stats().Models[model]
	if ms.MaxRequestsIn60s != 3 || ms.MaxAdmittedRequestsIn60s != 2 || ms.Admitted != 3 || ms.RateLimited != 2 {
		t.Errorf("model stats %+v", ms)
	}
}

func TestTPMExceeded(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, TPM: 2000}}, BurstFraction: 1, Now: clk.Now})
	small := body(model, "hi", 1200)
	wantStatus(t, chat(t, url, small), http.StatusOK)
	clk.Advance(10 * time.Second)
	r := chat(t, url, small)
	wantStatus(t, r, http.StatusTooManyRequests)
	e := r.apiErr(t)
	used, want := cost(t, small), fmt.Sprintf("tokens per min (TPM): Limit 2000, Used %d, Requested %d.", cost(t, small), cost(t, small))
	if e["type"] != "tokens" || !strings.Contains(e["message"].(string), want) {
		t.Errorf("error %v; want message with %q", e, want)
	}
	wantHeader(t, r, "Retry-After", "50")
	wantHeader(t, r, "x-ratelimit-remaining-tokens", strconv.Itoa(2000-used))
	wantHeader(t, r, "x-ratelimit-reset-tokens", "50s")

	// A prompt bigger than the whole minute can never run.
	big := body(model, strings.Repeat("lorem ipsum dolor sit amet ", 500), 10)
	r = chat(t, url, big)
	wantStatus(t, r, http.StatusTooManyRequests)
	if !strings.HasPrefix(r.apiErr(t)["message"].(string), "Request too large for "+model) || r.header.Get("Retry-After") != "" {
		t.Errorf("too large: %s, Retry-After %q", r.body, r.header.Get("Retry-After"))
	}
	ms := s.Stats().Models[model]
	if ms.MaxTokensIn60s != used || ms.ChargedTokens != int64(used) || ms.RateLimited != 2 {
		t.Errorf("model stats %+v", ms)
	}
}

func TestBurstCap(t *testing.T) {
	t.Parallel()
	clk := newClock()
	// The default quantum: RPM 300/60 = 5 requests per second; TPM 30000/60 = 500 tokens per second.
	s, url := start(t, sim.Config{
		Models: []sim.ModelLimits{{Name: model, RPM: 300}, {Name: "gpt-4.1", TPM: 30_000}},
		Now:    clk.Now,
	})
	b := body(model, "hi", 10)
	for range 5 {
		wantStatus(t, chat(t, url, b), http.StatusOK)
	}
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests)
	if e := r.apiErr(t); e["type"] != "requests" || !strings.Contains(e["message"].(string), "requests per second (RPM quantized to 1s): Limit 5, Used 5, Requested 1.") {
		t.Errorf("error %v", e)
	}
	wantHeader(t, r, "Retry-After", "1")
	wantHeader(t, r, "retry-after-ms", "1000")
	clk.Advance(time.Second)
	wantStatus(t, chat(t, url, b), http.StatusOK)

	// A request bigger than the token cap runs alone in its second...
	big := body("gpt-4.1", "hi", 900)
	wantStatus(t, chat(t, url, big), http.StatusOK)
	// ... but nothing joins it there.
	clk.Advance(500 * time.Millisecond)
	r = chat(t, url, body("gpt-4.1", "hi", 5))
	wantStatus(t, r, http.StatusTooManyRequests)
	if e := r.apiErr(t); e["type"] != "tokens" || !strings.Contains(e["message"].(string), "tokens per second (TPM quantized to 1s): Limit 500") {
		t.Errorf("error %v", e)
	}
	wantHeader(t, r, "retry-after-ms", "500")
	clk.Advance(500 * time.Millisecond)
	wantStatus(t, chat(t, url, body("gpt-4.1", "hi", 5)), http.StatusOK)

	st := s.Stats()
	if m := st.Models[model]; m.BurstRequests != 5 || m.MaxAdmittedRequestsIn1s != 5 || m.MaxRequestsIn1s != 6 {
		t.Errorf("%s stats %+v", model, m)
	}
	if m := st.Models["gpt-4.1"]; m.BurstTokens != 500 || m.MaxTokensIn1s != cost(t, big) {
		t.Errorf("gpt-4.1 stats %+v", m)
	}
}

// TestWindowStatsExact sends a random workload through HTTP under a fake
// clock and checks the window maxima against a brute-force computation over
// the arrivals, and that no admitted window exceeded a limit.
func TestWindowStatsExact(t *testing.T) {
	t.Parallel()
	clk := newClock()
	lim := sim.ModelLimits{Name: model, RPM: 20, TPM: 6000}
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{lim}, BurstFraction: 0.2, Now: clk.Now})
	type arrival struct {
		at       time.Time
		admitted bool
		cost     int
	}
	var log []arrival
	seed := uint64(7)
	next := func(n int) int { // xorshift: deterministic and dependency-free
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	for range 300 {
		if next(4) > 0 {
			clk.Advance(time.Duration(next(10_000)) * time.Millisecond)
		}
		b := body(model, "tell me something", 50+next(800))
		r := chat(t, url, b)
		log = append(log, arrival{at: clk.Now(), admitted: r.status == http.StatusOK, cost: cost(t, b)})
	}
	var want [6]int // reqs60, adm60, tok60, reqs1, adm1, tok1
	for i, end := range log {
		for w, span := range []time.Duration{time.Minute, time.Second} {
			var reqs, adm, tok int
			for _, a := range log[:i+1] {
				if a.at.After(end.at.Add(-span)) {
					reqs++
					if a.admitted {
						adm++
						tok += a.cost
					}
				}
			}
			want[3*w], want[3*w+1], want[3*w+2] = max(want[3*w], reqs), max(want[3*w+1], adm), max(want[3*w+2], tok)
		}
	}
	ms := s.Stats().Models[model]
	got := [6]int{ms.MaxRequestsIn60s, ms.MaxAdmittedRequestsIn60s, ms.MaxTokensIn60s, ms.MaxRequestsIn1s, ms.MaxAdmittedRequestsIn1s, ms.MaxTokensIn1s}
	t.Logf("admitted %d, rejected %d, maxima %v", ms.Admitted, ms.RateLimited, got)
	if got != want {
		t.Fatalf("window maxima %v, brute force %v", got, want)
	}
	if got[1] > lim.RPM || got[2] > lim.TPM || got[4] > ms.BurstRequests || ms.RateLimited == 0 || ms.Admitted < 50 {
		t.Fatalf("maxima %v over limits %+v (burst %d), or workload too tame: %+v", got, lim, ms.BurstRequests, ms)
	}
}

func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 10}}})
	b := body(model, "hi", 10)
	first := chat(t, url, b, "Idempotency-Key", "op-1", "X-Sluice-Job-Id", "job-1")
	second := chat(t, url, b, "Idempotency-Key", "op-1", "X-Sluice-Job-Id", "job-1")
	wantStatus(t, first, http.StatusOK)
	wantStatus(t, second, http.StatusOK)
	wantHeader(t, second, "Idempotent-Replayed", "true")
	if first.header.Get("Idempotent-Replayed") != "" || first.json(t)["id"] != second.json(t)["id"] {
		t.Errorf("first %s, second %s", first.body, second.body)
	}
	st := s.Stats()
	if st.Completed != 1 || st.Replayed != 1 || st.DuplicateCompletions != 0 || st.Models[model].Admitted != 1 ||
		st.IdempotencyCompletions["op-1"] != 1 || st.JobCompletions["job-1"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestIdempotentWaitsForInFlight(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, TTFT: 300 * time.Millisecond})
	b := body(model, "hi", 10)
	firstc := make(chan reply, 1)
	go func() {
		r, _ := try(context.Background(), http.MethodPost, url+"/v1/chat/completions", b, "Idempotency-Key", "op-2")
		firstc <- r
	}()
	natstest.Eventually(t, 2*time.Second, func() error {
		if n := s.Stats().Models[model].Admitted; n != 1 {
			return fmt.Errorf("admitted %d, want 1", n)
		}
		return nil
	})
	second := chat(t, url, b, "Idempotency-Key", "op-2")
	first := <-firstc
	wantStatus(t, first, http.StatusOK)
	wantStatus(t, second, http.StatusOK)
	wantHeader(t, second, "Idempotent-Replayed", "true")
	if first.json(t)["id"] != second.json(t)["id"] {
		t.Errorf("ids differ: %s vs %s", first.body, second.body)
	}
	if st := s.Stats(); st.Completed != 1 || st.Replayed != 1 || st.Models[model].Admitted != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestIdempotencyKeyReleasedWhenRejected(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1}}, Now: clk.Now})
	b := body(model, "hi", 10)
	wantStatus(t, chat(t, url, b), http.StatusOK)
	wantStatus(t, chat(t, url, b, "Idempotency-Key", "op-3"), http.StatusTooManyRequests)
	clk.Advance(2 * time.Minute)
	r := chat(t, url, b, "Idempotency-Key", "op-3")
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Error("the rejected attempt was replayed")
	}
	if st := s.Stats(); st.Completed != 2 || st.IdempotencyCompletions["op-3"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestClientGoneStillCompletes(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, TTFT: 5 * time.Second})
	b := body(model, "hi", 10)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := try(ctx, http.MethodPost, url+"/v1/chat/completions", b, "Idempotency-Key", "op-4"); err == nil {
		t.Fatal("expected the client to time out")
	}
	natstest.Eventually(t, 2*time.Second, func() error {
		if st := s.Stats(); st.Completed != 1 || st.ClientGone != 1 {
			return fmt.Errorf("completed %d, client gone %d; want 1 and 1", st.Completed, st.ClientGone)
		}
		return nil
	})
	r := chat(t, url, b, "Idempotency-Key", "op-4")
	wantStatus(t, r, http.StatusOK)
	wantHeader(t, r, "Idempotent-Replayed", "true")
}

func TestDuplicateJobIDCounted(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}})
	b := body(model, "hi", 10)
	for range 3 {
		wantStatus(t, chat(t, url, b, "X-Sluice-Job-Id", "job-9"), http.StatusOK)
	}
	wantStatus(t, chat(t, url, b, "X-Sluice-Job-Id", "job-10"), http.StatusOK)
	if st := s.Stats(); st.Completed != 4 || st.DuplicateCompletions != 2 || st.JobCompletions["job-9"] != 3 || st.JobCompletions["job-10"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	_, url := start(t, sim.Config{
		Models:       []sim.ModelLimits{{Name: model}},
		TTFT:         40 * time.Millisecond,
		PerToken:     time.Millisecond,
		OutputTokens: func(maxTokens int, _ []byte) int { return 1000 }, // clamped to max
	})
	began := time.Now()
	r := chat(t, url, body(model, "hi", 30))
	wantStatus(t, r, http.StatusOK)
	if el := time.Since(began); el < 70*time.Millisecond {
		t.Errorf("answered after %v, want >= 70ms", el)
	}
	c := r.json(t)["choices"].([]any)[0].(map[string]any)
	if c["finish_reason"] != "length" || r.json(t)["usage"].(map[string]any)["completion_tokens"] != 30.0 {
		t.Errorf("reply %s", r.body)
	}
}

func TestRequestErrors(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, APIKeys: []string{"sk-good-key-123"}})
	auth := []string{"Authorization", "Bearer sk-good-key-123"}
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		typ, code, param         string
		msg                      string
	}{
		{"unknown model", "POST", "/v1/chat/completions", body("gpt-9", "hi", 5), auth, 404, "invalid_request_error", "model_not_found", "", "`gpt-9` does not exist"},
		{"no key", "POST", "/v1/chat/completions", body(model, "hi", 5), nil, 401, "invalid_request_error", "invalid_api_key", "", "didn't provide an API key"},
		{"bad key", "POST", "/chat/completions", body(model, "hi", 5), []string{"Authorization", "Bearer sk-wrong-key-456"}, 401, "invalid_request_error", "invalid_api_key", "", "Incorrect API key provided: sk-*****-456"},
		{"stream n=2", "POST", "/v1/chat/completions", `{"model":"gpt-4o-mini","n":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, auth, 400, "invalid_request_error", "unsupported_value", "n", "only n=1"},
		{"malformed", "POST", "/v1/chat/completions", `{"model":`, auth, 400, "invalid_request_error", "", "", "malformed"},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[]}`, auth, 400, "invalid_request_error", "", "messages", "at least one message"},
		{"wrong method", "GET", "/v1/chat/completions", "", auth, 405, "invalid_request_error", "", "", "not allowed"},
		{"unknown route", "POST", "/v1/audio/speech", "{}", auth, 404, "invalid_request_error", "unknown_url", "", "Unknown request URL"},
	} {
		r := do(t, tc.method, url+tc.path, tc.body, tc.hdr...)
		if r.status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.status, tc.status, r.body)
			continue
		}
		e := r.apiErr(t)
		str := func(k string) string { v, _ := e[k].(string); return v }
		if str("type") != tc.typ || str("code") != tc.code || str("param") != tc.param || !strings.Contains(str("message"), tc.msg) {
			t.Errorf("%s: error %v", tc.name, e)
		}
	}
	if st := s.Stats(); st.Requests[401] != 2 || st.Requests[400] != 3 || st.Models[model].Admitted != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestQuotaFault(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{
		Models: []sim.ModelLimits{{Name: model, RPM: 10}, {Name: "gpt-4.1", RPM: 10}},
		Faults: sim.Faults{QuotaModels: []string{"gpt-4.1"}, QuotaKeys: []string{"sk-broke"}},
	})
	for _, tc := range []struct{ model, key string }{{"gpt-4.1", "sk-fine"}, {model, "sk-broke"}} {
		r := chat(t, url, body(tc.model, "hi", 5), "Authorization", "Bearer "+tc.key)
		wantStatus(t, r, http.StatusTooManyRequests)
		e := r.apiErr(t)
		if e["type"] != "insufficient_quota" || e["code"] != "insufficient_quota" ||
			e["message"] != "You exceeded your current quota, please check your plan and billing details." {
			t.Errorf("%+v: error %v", tc, e)
		}
		if r.header.Get("Retry-After") != "" || r.header.Get("retry-after-ms") != "" {
			t.Errorf("%+v: quota error with Retry-After", tc)
		}
	}
	wantStatus(t, chat(t, url, body(model, "hi", 5), "Authorization", "Bearer sk-fine"), http.StatusOK)
	if st := s.Stats(); st.Models["gpt-4.1"].MaxRequestsIn60s != 0 || st.Models[model].MaxRequestsIn60s != 1 {
		t.Errorf("quota errors were charged: %+v", st.Models)
	}
}

func TestServerErrorFaults(t *testing.T) {
	t.Parallel()
	faults := sim.Faults{Seed: 11, Rate500: 0.1, Rate502: 0.05, Rate503: 0.2}
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: faults})
	const n = 400
	var statuses []int
	b := body(model, "hi", 5)
	for range n {
		r := chat(t, url, b)
		statuses = append(statuses, r.status)
		if r.status >= 500 {
			if e := r.apiErr(t); e["type"] != "server_error" {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		}
	}
	st := s.Stats()
	for status, rate := range map[int]float64{500: 0.1, 502: 0.05, 503: 0.2, 200: 0.65} {
		if sd := math.Sqrt(n * rate * (1 - rate)); math.Abs(float64(st.Requests[status])-n*rate) > 4*sd {
			t.Errorf("status %d: %d of %d, want about %g", status, st.Requests[status], n, n*rate)
		}
	}
	if ms := st.Models[model]; st.Completed != st.Requests[200] || ms.Admitted != n {
		t.Errorf("faulted requests: completed %d, admitted %d", st.Completed, ms.Admitted)
	}

	// The same seed gives the same sequence, also after Reset.
	s.Reset()
	twin := sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: faults}
	twin.Count.Mode = sim.CountSluice
	ts, _ := sim.New(twin)
	for i, want := range statuses {
		for _, srv := range []*sim.Server{s, ts} {
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(b)))
			if rec.Code != want {
				t.Fatalf("request %d: status %d, first run %d", i, rec.Code, want)
			}
		}
	}
}

func TestConnectionFaults(t *testing.T) {
	t.Parallel()
	reset, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: sim.Faults{RateReset: 1}})
	if r, err := try(context.Background(), http.MethodPost, url+"/v1/chat/completions", body(model, "hi", 5)); err == nil {
		t.Fatalf("reset fault answered %d", r.status)
	}
	if st := reset.Stats(); st.ConnResets != 1 || st.Completed != 0 || st.Models[model].Admitted != 1 {
		t.Errorf("reset stats %+v", st)
	}

	hung, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: sim.Faults{RateHang: 1, HangFor: 100 * time.Millisecond}})
	began := time.Now()
	if r, err := try(context.Background(), http.MethodPost, url+"/v1/chat/completions", body(model, "hi", 5)); err == nil {
		t.Fatalf("hang fault answered %d", r.status)
	}
	if el := time.Since(began); el < 100*time.Millisecond {
		t.Errorf("hang dropped after %v", el)
	}
	if st := hung.Stats(); st.Hangs != 1 || st.Completed != 0 {
		t.Errorf("hang stats %+v", st)
	}
}

func TestTimelineAndSteadyStateFill(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 120, TPM: 1_000_000}}, Now: clk.Now})
	b := body(model, "hi", 100)
	c := cost(t, b)
	if rpm, tpm := s.Stats().Models[model].SteadyStateFill(); rpm != 0 || tpm != 0 {
		t.Errorf("fill of an empty run: %g, %g", rpm, tpm)
	}
	for range 130 { // one request a second for 130 s: half the RPM
		wantStatus(t, chat(t, url, b), http.StatusOK)
		clk.Advance(time.Second)
	}
	clk.Advance(300 * time.Millisecond) // partial second: not in the timeline
	ms := s.Stats().Models[model]
	if len(ms.Timeline) != 130 {
		t.Fatalf("timeline of %d seconds, want 130", len(ms.Timeline))
	}
	for i, sec := range ms.Timeline {
		if sec != (sim.Second{Admitted: 1, ChargedTokens: int64(c), Successes: 1, SuccessTokens: int64(c)}) {
			t.Fatalf("second %d: %+v", i, sec)
		}
	}
	rpm, tpm := ms.SteadyStateFill()
	if math.Abs(rpm-0.5) > 1e-9 || math.Abs(tpm-float64(60*c)/1e6) > 1e-9 {
		t.Errorf("fill %g, %g; want 0.5, %g", rpm, tpm, float64(60*c)/1e6)
	}
	if n := len(ms.FillSeries()); n != 70 {
		t.Errorf("%d fill windows, want 70", n)
	}
}

func TestControlRoutes(t *testing.T) {
	t.Parallel()
	clk := newClock()
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 5}, {Name: "gpt-4.1"}}, Now: clk.Now})
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(do(t, http.MethodGet, url+"/v1/models", "").body, &list); err != nil || list.Object != "list" ||
		len(list.Data) != 2 || list.Data[0].ID != model || list.Data[1].Object != "model" {
		t.Errorf("models %+v, %v", list, err)
	}
	wantStatus(t, chat(t, url, body(model, "hi", 5), "Idempotency-Key", "k", "X-Sluice-Job-Id", "j"), http.StatusOK)
	clk.Advance(2 * time.Second)

	var st sim.Stats
	if err := json.Unmarshal(do(t, http.MethodGet, url+"/stats", "").body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Completed != 1 || st.Models[model].SuccessRequests != 1 || len(st.Models[model].Timeline) != 2 || st.JobCompletions["j"] != 1 {
		t.Errorf("stats %+v", st)
	}
	var sum sim.Stats
	_ = json.Unmarshal(do(t, http.MethodGet, url+"/stats?summary=1", "").body, &sum)
	if sum.Completed != 1 || sum.Models[model].Timeline != nil || sum.IdempotencyCompletions != nil {
		t.Errorf("summary %+v", sum)
	}

	wantStatus(t, do(t, http.MethodPost, url+"/reset", ""), http.StatusNoContent)
	var after sim.Stats
	_ = json.Unmarshal(do(t, http.MethodGet, url+"/stats", "").body, &after)
	if after.Completed != 0 || after.Models[model].MaxRequestsIn60s != 0 || len(after.IdempotencyCompletions) != 0 || !after.StartedAt.Equal(clk.Now()) {
		t.Errorf("after reset %+v", after)
	}
	// The ledger is gone too: the key runs again.
	r := chat(t, url, body(model, "hi", 5), "Idempotency-Key", "k")
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Error("replayed after reset")
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]sim.Config{
		"no models":      {},
		"empty name":     {Models: []sim.ModelLimits{{}}},
		"duplicate":      {Models: []sim.ModelLimits{{Name: "a"}, {Name: "a"}}},
		"negative rpm":   {Models: []sim.ModelLimits{{Name: "a", RPM: -1}}},
		"negative tpm":   {Models: []sim.ModelLimits{{Name: "a", TPM: -1}}},
		"burst":          {Models: []sim.ModelLimits{{Name: "a"}}, BurstFraction: 1.5},
		"profile":        {Models: []sim.ModelLimits{{Name: "a"}}, Profile: "openai"},
		"bucket":         {Models: []sim.ModelLimits{{Name: "a"}}, Profile: sim.ProfileTokenBucket, BucketSeconds: 61},
		"bucket size":    {Models: []sim.ModelLimits{{Name: "a", TPM: 1 << 60}}, Profile: sim.ProfileTokenBucket},
		"accel floor":    {Models: []sim.ModelLimits{{Name: "a"}}, AccelFloor: 1.5},
		"accel growth":   {Models: []sim.ModelLimits{{Name: "a"}}, AccelGrowth: 0.5},
		"fault rate":     {Models: []sim.ModelLimits{{Name: "a"}}, Faults: sim.Faults{Rate500: 2}},
		"fault sum":      {Models: []sim.ModelLimits{{Name: "a"}}, Faults: sim.Faults{Rate500: 0.6, RateHang: 0.6}},
		"negative ttft":  {Models: []sim.ModelLimits{{Name: "a"}}, TTFT: -time.Second},
		"empty api key":  {Models: []sim.ModelLimits{{Name: "a"}}, APIKeys: []string{""}},
		"negative maxtk": {Models: []sim.ModelLimits{{Name: "a"}}, DefaultMaxTokens: -1},
	} {
		if _, err := sim.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func BenchmarkServeHTTP(b *testing.B) {
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1 << 30, TPM: 1 << 40}}})
	if err != nil {
		b.Fatal(err)
	}
	payload := body(model, "Write a haiku about rate limits.", 64)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(payload)))
			if rec.Code != http.StatusOK {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// TestConcurrentAdmissionIsExact fires many requests at one instant: exactly
// the limit is admitted, whatever the interleaving.
func TestConcurrentAdmissionIsExact(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 40}}, BurstFraction: 1, Now: clk.Now})
	b := body(model, "hi", 5)
	var wg sync.WaitGroup
	for range 120 {
		wg.Go(func() {
			if _, err := try(context.Background(), http.MethodPost, url+"/v1/chat/completions", b); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if ms := st.Models[model]; st.Requests[200] != 40 || st.Requests[429] != 80 || ms.MaxAdmittedRequestsIn60s != 40 || ms.MaxRequestsIn60s != 120 {
		t.Errorf("stats %+v, model %+v", st.Requests, ms)
	}
}
