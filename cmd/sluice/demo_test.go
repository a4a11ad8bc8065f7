package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
)

// TestDemoFinishes runs `sluice demo`, the README's first command, on a
// smaller load: every job gets its result (none refused at submission, none
// lost, none failed), the provider never accepts more than its limits, no
// job spends a second attempt, and the bad inputs get their own errors. The
// demo once waited forever for 76 results because its OpenAI-API tenant
// waited on more calls at once than a tenant may
// (limits.max_waiters_per_tenant) and the refused calls were not counted.
//
// A 429 is not a failure here: on a starved machine (CI runs the suite on
// two cores) the simulator's handler has run up to 137 ms after a request
// was written, past send_tolerance, and a call planned within the quantum
// then shares the second of the calls after it; it goes back to its queue
// without spending an attempt (the demo fails if one is spent). The test
// bounds such refusals at a twentieth of the calls, which a plan that
// broke the quantum would exceed; BenchmarkDemo holds the demo to none.
func TestDemoFinishes(t *testing.T) {
	systest.SkipShort(t)
	// Not parallel: it is a whole mesh at full pace for half a minute, and
	// beside the parallel tests that hold the provider to 0 429s it
	// starved them (one 429 in TestEndToEnd in a clean-clone CI run).
	s := runDemoForTest(t)
	calls, refused := demoCalls(t, s)
	t.Logf("the provider answered %d of %d calls 429", refused, calls)
	if refused > max(3, calls/20) {
		t.Errorf("the provider answered %d of %d calls 429, want at most a twentieth:\n%s", refused, calls, s)
	}
}

// BenchmarkDemo is TestDemoFinishes held to the demo's strict claim: the
// provider answers no 429 (every call reaches it within send_tolerance of
// its instant, as on a quiet machine).
func BenchmarkDemo(b *testing.B) {
	for range b.N {
		s := runDemoForTest(b)
		calls, refused := demoCalls(b, s)
		b.ReportMetric(float64(refused), "429s")
		if refused != 0 {
			b.Errorf("the provider answered %d of %d calls 429, want none:\n%s", refused, calls, s)
		}
	}
}

// runDemoForTest runs the demo on a smaller load, checks what holds however
// busy the machine is, and returns its output.
func runDemoForTest(tb testing.TB) string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"demo", "--load", "0.4", "--timeout", "150s"}, func(string) string { return "" }, &out, &errOut); err != nil {
		tb.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	s := out.String()
	for _, want := range []string{
		"Every job got exactly one result",
		" 0 failed, 0 expired, 0 refused at submission",
		"paid twice     0 operations",
		"HTTP 400 invalid_request",
		"HTTP 404 unknown_model",
	} {
		if !strings.Contains(s, want) {
			tb.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
	// globex's batch-priority jobs went through the batch lane, each
	// answered by one line of the simulator's Batch API.
	if m := regexp.MustCompile(`batch lane +(\d+) jobs answered by (\d+) batch lines`).FindStringSubmatch(s); m == nil || m[1] == "0" || m[1] != m[2] {
		tb.Errorf("demo output: want globex's jobs through the batch lane, one line each:\n%s", s)
	}
	return s
}

// demoCalls reads the provider's calls and 429s from the demo's summary.
func demoCalls(tb testing.TB, s string) (calls, refused int) {
	m := regexp.MustCompile(`provider saw +(\d+) requests: \d+ answered 200, (\d+) answered 429`).FindStringSubmatch(s)
	if m == nil {
		tb.Fatalf("demo output lacks the provider's requests:\n%s", s)
	}
	calls, _ = strconv.Atoi(m[1])
	refused, _ = strconv.Atoi(m[2])
	return calls, refused
}
