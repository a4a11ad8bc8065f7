package sim_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

const claude = "claude-sim"

// messages posts a Messages API body and returns the status, headers and
// decoded answer.
func messages(t *testing.T, url, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, out
}

func anUsage(t *testing.T, out map[string]any) map[string]int {
	t.Helper()
	u, ok := out["usage"].(map[string]any)
	if !ok {
		t.Fatalf("no usage in %v", out)
	}
	got := map[string]int{}
	for k, v := range u {
		got[k] = int(v.(float64))
	}
	return got
}

// anBody is a Messages body: a system prompt of sysChars characters with a
// breakpoint (none when sysChars is 0) and a user turn of turnChars.
func anBody(sysChars, turnChars, maxTokens int) string {
	b := map[string]any{"model": claude, "max_tokens": maxTokens,
		"messages": []map[string]any{{"role": "user", "content": strings.Repeat("u", turnChars)}}}
	if sysChars > 0 {
		b["system"] = []map[string]any{{"type": "text", "text": strings.Repeat("s", sysChars), "cache_control": map[string]string{"type": "ephemeral"}}}
	}
	out, _ := json.Marshal(b)
	return string(out)
}

// TestMessagesInputBucket: ITPM is a continuously refilled bucket charged
// the uncached input at arrival; a refusal is Anthropic's 429.
func TestMessagesInputBucket(t *testing.T) {
	t.Parallel()
	clk := newClock()
	// 60,000 ITPM: 1,000 a second, a bucket of one second.
	s, url := start(t, sim.Config{Profile: sim.ProfileAnthropic, Now: clk.Now, BucketSeconds: 1,
		Models: []sim.ModelLimits{{Name: claude, RPM: 1000, ITPM: 60_000, OTPM: 60_000}}})
	body := anBody(0, 3200, 10) // 800 + 3 input tokens
	status, h, out := messages(t, url, body)
	if status != http.StatusOK {
		t.Fatalf("first: %d %v", status, out)
	}
	if u := anUsage(t, out); u["input_tokens"] != 803 || u["cache_read_input_tokens"] != 0 {
		t.Errorf("usage %v, want 803 input tokens", u)
	}
	if got := h.Get("Anthropic-Ratelimit-Input-Tokens-Remaining"); got != "197" {
		t.Errorf("input tokens remaining %q, want 197", got)
	}
	if _, err := time.Parse(time.RFC3339, h.Get("Anthropic-Ratelimit-Input-Tokens-Reset")); err != nil {
		t.Errorf("reset %q: %v", h.Get("Anthropic-Ratelimit-Input-Tokens-Reset"), err)
	}
	status, h, out = messages(t, url, body)
	if status != http.StatusTooManyRequests {
		t.Fatalf("second at once: %d, want 429", status)
	}
	e, _ := out["error"].(map[string]any)
	if out["type"] != "error" || e["type"] != "rate_limit_error" || !strings.Contains(e["message"].(string), "60,000 input tokens per minute") {
		t.Errorf("429 body %v", out)
	}
	if h.Get("Retry-After") != "1" {
		t.Errorf("retry-after %q, want 1", h.Get("Retry-After"))
	}
	clk.Advance(606 * time.Millisecond) // 197 + 606 = 803
	if status, _, out = messages(t, url, body); status != http.StatusOK {
		t.Fatalf("after the refill: %d %v", status, out)
	}
	st := s.Messages()[claude]
	if st.Admitted != 2 || st.RateLimited != 1 || st.RateLimitedBy["input_tokens"] != 1 || st.InputCharged != 2*803 {
		t.Errorf("stats %+v", st)
	}
}

// TestMessagesOutputBucket: OTPM is charged max_tokens at arrival and given
// back what the answer did not use.
func TestMessagesOutputBucket(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Profile: sim.ProfileAnthropic, Now: clk.Now, BucketSeconds: 1,
		OutputTokens: func(int, []byte) int { return 10 },
		Models:       []sim.ModelLimits{{Name: claude, OTPM: 6000}}}) // 100 a second
	body := anBody(0, 40, 100)
	if status, _, out := messages(t, url, body); status != http.StatusOK {
		t.Fatalf("first: %d %v", status, out)
	}
	// 90 of the 100 came back: a request for 100 does not fit yet.
	status, h, _ := messages(t, url, body)
	if status != http.StatusTooManyRequests || h.Get("Anthropic-Ratelimit-Output-Tokens-Remaining") != "90" {
		t.Fatalf("second: %d, output remaining %q; want 429 with 90", status, h.Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
	}
	clk.Advance(100 * time.Millisecond)
	if status, _, _ := messages(t, url, body); status != http.StatusOK {
		t.Fatalf("after 10 tokens of refill: %d", status)
	}
	if st := s.Messages()[claude]; st.OutputCharged != 20 || st.RateLimitedBy["output_tokens"] != 1 {
		t.Errorf("stats %+v, want 20 output tokens charged", st)
	}
}

// TestMessagesCache: a prefix answered with a breakpoint is read from the
// cache by the next request, and cache reads are free unless the model
// counts them.
func TestMessagesCache(t *testing.T) {
	t.Parallel()
	for _, counts := range []bool{false, true} {
		s, url := start(t, sim.Config{Profile: sim.ProfileAnthropic,
			Models: []sim.ModelLimits{{Name: claude, ITPM: 600_000, CacheReadsCount: counts}}})
		first := anBody(12_000, 800, 10) // a 3,000-token system prompt
		_, _, out := messages(t, url, first)
		if u := anUsage(t, out); u["cache_creation_input_tokens"] != 3000 || u["cache_read_input_tokens"] != 0 || u["input_tokens"] != 203 {
			t.Errorf("first: usage %v, want 3,000 written", u)
		}
		_, _, out = messages(t, url, anBody(12_000, 804, 10))
		if u := anUsage(t, out); u["cache_read_input_tokens"] != 3000 || u["cache_creation_input_tokens"] != 0 || u["input_tokens"] != 204 {
			t.Errorf("second: usage %v, want 3,000 read", u)
		}
		want := int64(3203 + 204)
		if counts {
			want += 3000
		}
		if st := s.Messages()[claude]; st.InputCharged != want || st.CacheRead != 3000 || st.CacheWrite != 3000 {
			t.Errorf("cache_reads_count %v: stats %+v, want %d input charged", counts, st, want)
		}
		// A prefix below the minimum is never cached.
		_, _, out = messages(t, url, anBody(400, 10, 10))
		_, _, out = messages(t, url, anBody(400, 10, 10))
		if u := anUsage(t, out); u["cache_read_input_tokens"] != 0 || u["cache_creation_input_tokens"] != 0 {
			t.Errorf("short prefix: usage %v", u)
		}
	}
}
