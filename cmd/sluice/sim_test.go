package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// startSimCommand runs `sluice sim args...` on a loopback port until the
// test ends and returns its base URL.
func startSimCommand(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runSim(ctx, append([]string{"--listen", "127.0.0.1:0", "--ttft", "0", "--per-token", "0"}, args...), nil, pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sluice sim: %v", err)
		}
	})
	ready := regexp.MustCompile(`on (http://\S+)/v1 \(profile (\S+);`)
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := ready.FindStringSubmatch(sc.Text()); m != nil {
				found <- m
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case m := <-found:
		return m[1]
	case err := <-done:
		t.Fatalf("sluice sim exited: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("sluice sim did not start")
	}
	return ""
}

func TestSimProfileFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args        []string
		profile     string
		short       float64 // short window (bucket) seconds
		shortReqs   float64
		wantHeaders []string // x-ratelimit-* headers of a 200
	}{
		{nil, sim.ProfileQuantized, 1, 10, []string{"Limit-Requests", "Remaining-Requests", "Reset-Requests"}},
		{[]string{"--burst-fraction", "0.1"}, sim.ProfileQuantized, 1, 60, []string{"Limit-Requests", "Remaining-Requests", "Reset-Requests"}},
		{[]string{"--profile", "token-bucket", "--bucket-seconds", "2.5"}, sim.ProfileTokenBucket, 2.5, 25, []string{"Limit-Requests", "Remaining-Requests", "Reset-Requests"}},
		{[]string{"--profile", "azure"}, sim.ProfileAzure, 10, 100, []string{"Remaining-Requests"}},
		{[]string{"--profile", "acceleration"}, sim.ProfileAcceleration, 1, 10, []string{"Limit-Requests", "Remaining-Requests", "Reset-Requests"}},
		{[]string{"--profile", "hidden"}, sim.ProfileHidden, 1, 10, nil},
		{[]string{"--no-rate-headers"}, sim.ProfileQuantized, 1, 10, nil},
	} {
		t.Run(strings.Join(append([]string{"sim"}, tc.args...), " "), func(t *testing.T) {
			t.Parallel()
			url := startSimCommand(t, append([]string{"--models", "m=600/0"}, tc.args...)...)
			resp, err := http.Post(url+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var got []string
			for k := range resp.Header {
				if name, ok := strings.CutPrefix(k, "X-Ratelimit-"); ok {
					got = append(got, name)
				}
			}
			if resp.StatusCode != http.StatusOK || !sameSet(got, tc.wantHeaders) {
				t.Errorf("status %d, rate headers %v, want %v", resp.StatusCode, got, tc.wantHeaders)
			}

			resp, err = http.Get(url + "/stats?summary=1")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var st sim.Stats
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatal(err)
			}
			if ms := st.Models["m"]; st.Profile != tc.profile || ms.ShortWindowSeconds != tc.short || ms.ShortRequests != tc.shortReqs {
				t.Errorf("profile %q, short window %gs of %g requests; want %q, %gs of %g", st.Profile, ms.ShortWindowSeconds, ms.ShortRequests,
					tc.profile, tc.short, tc.shortReqs)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		found := false
		for _, y := range a {
			found = found || x == y
		}
		if !found {
			return false
		}
	}
	return true
}

func TestSimRejectsBadProfileFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--profile", "openai"}, "valid profiles: quantized, token-bucket, azure, acceleration, hidden"},
		{[]string{"--profile", "azure", "--burst-fraction", "0.1"}, "--burst-fraction has no effect with --profile azure"},
		{[]string{"--profile", "token-bucket", "--burst-fraction", "0.1"}, "--burst-fraction has no effect with --profile token-bucket"},
		{[]string{"--bucket-seconds", "2"}, "--bucket-seconds has no effect with --profile quantized"},
		{[]string{"--profile", "token-bucket", "--bucket-seconds", "90"}, "bucket seconds must be in"},
		{[]string{"--batch-duration", "-1s"}, "batch duration, expiry and limits must be >= 0"},
	} {
		err := runSim(context.Background(), append([]string{"--listen", "127.0.0.1:0"}, tc.args...), nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestSimHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runSim(context.Background(), []string{"-h"}, nil, io.Discard, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range append(sim.Profiles(), "-profile", "-bucket-seconds", "-no-rate-headers", "-burst-fraction", "retry-after-ms") {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}

// TestSimModelsDayQuota: --models takes per-day quotas after the
// per-minute limits, and the simulator enforces them; malformed lists are
// refused with the expected form.
func TestSimModelsDayQuota(t *testing.T) {
	t.Parallel()
	url := startSimCommand(t, "--models", "m=600/0/1/0")
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want != http.StatusOK && !strings.Contains(string(body), "requests per day (RPD): Limit 1")) {
			t.Errorf("request %d: %d %s, want %d", i+1, resp.StatusCode, body, want)
		}
	}
	for _, bad := range []string{"m=1/2/3", "m=1/2/3/4/5", "m=1/-2", "m=a/1"} {
		err := runSim(context.Background(), []string{"--listen", "127.0.0.1:0", "--models", bad}, nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--models") {
			t.Errorf("--models %s: error %v, want it refused", bad, err)
		}
	}
}

// TestSimModelsAnthropic: with --profile anthropic, --models takes
// Anthropic's three limits, RPM/ITPM/OTPM, which the simulator states in
// its headers; the two-field form is refused there.
func TestSimModelsAnthropic(t *testing.T) {
	t.Parallel()
	url := startSimCommand(t, "--profile", "anthropic", "--models", "m=600/100000/5000")
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`))
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", "k")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s, want 200", resp.StatusCode, b)
	}
	for h, want := range map[string]string{"requests": "600", "input-tokens": "100000", "output-tokens": "5000"} {
		if got := resp.Header.Get("anthropic-ratelimit-" + h + "-limit"); got != want {
			t.Errorf("anthropic-ratelimit-%s-limit = %q, want %s", h, got, want)
		}
	}
	err = runSim(context.Background(), []string{"--listen", "127.0.0.1:0", "--profile", "anthropic", "--models", "m=1/2"}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "RPM/ITPM/OTPM") {
		t.Errorf("--models m=1/2 under anthropic: error %v, want the three-limit form asked for", err)
	}
}

// TestSimToolCallsFlag: --tool-calls 1 answers a request offering a tool
// (tool_choice auto) with one call, then text once its result is in.
func TestSimToolCallsFlag(t *testing.T) {
	t.Parallel()
	url := startSimCommand(t, "--models", "m=600/0", "--tool-calls", "1")
	post := func(body string) (finish string) {
		t.Helper()
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("answer %+v (%v)", out, err)
		}
		return out.Choices[0].FinishReason
	}
	tools := `"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`
	if got := post(`{"model":"m","max_tokens":5,` + tools + `,"messages":[{"role":"user","content":"hi"}]}`); got != "tool_calls" {
		t.Errorf("first round: finish %q, want tool_calls", got)
	}
	if got := post(`{"model":"m","max_tokens":5,` + tools + `,"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"1"}]}`); got == "tool_calls" {
		t.Errorf("after the tool result: finish %q, want text", got)
	}
}

// TestSimBatchFlags: --batch-queue limits Anthropic's processing queue and
// --batch-duration keeps a batch in progress; both reach the simulator.
func TestSimBatchFlags(t *testing.T) {
	t.Parallel()
	base := startSimCommand(t, "--profile", "anthropic", "--batch-queue", "2", "--batch-duration", "1h")
	submit := func(n int) int {
		var reqs []string
		for i := range n {
			reqs = append(reqs, fmt.Sprintf(`{"custom_id":"r%d","params":{"model":"claude-3-5-haiku-latest","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}}`, i))
		}
		req, err := http.NewRequest(http.MethodPost, base+"/v1/messages/batches", strings.NewReader(`{"requests":[`+strings.Join(reqs, ",")+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Anthropic-Version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := submit(2); got != http.StatusOK {
		t.Fatalf("2 requests into a queue of 2: got %d, want 200", got)
	}
	if got := submit(1); got != http.StatusTooManyRequests {
		t.Errorf("one more while the first batch takes an hour: got %d, want 429", got)
	}
}
