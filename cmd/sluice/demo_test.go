package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
)

// TestDemoFinishes runs `sluice demo`, the README's first command, on a
// smaller load: every job gets its result (none refused at submission, none
// lost), the provider's limits hold, and the bad inputs get their own
// errors. The demo once waited forever for 76 results because its
// OpenAI-API tenant waited on more calls at once than a tenant may
// (limits.max_waiters_per_tenant) and the refused calls were not counted.
func TestDemoFinishes(t *testing.T) {
	systest.SkipShort(t)
	// Not parallel: it is a whole mesh at full pace for half a minute, and
	// beside the parallel tests that hold the provider to 0 429s it
	// starved them (one 429 in TestEndToEnd in a clean-clone CI run).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"demo", "--load", "0.4", "--timeout", "150s"}, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	s := out.String()
	for _, want := range []string{
		"Every job got exactly one result",
		" 0 refused at submission",
		"paid twice     0 operations",
		"HTTP 400 invalid_request",
		"HTTP 404 unknown_model",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
	// globex's batch-priority jobs went through the batch lane, each
	// answered by one line of the simulator's Batch API.
	if m := regexp.MustCompile(`batch lane +(\d+) jobs answered by (\d+) batch lines`).FindStringSubmatch(s); m == nil || m[1] == "0" || m[1] != m[2] {
		t.Errorf("demo output: want globex's jobs through the batch lane, one line each:\n%s", s)
	}
}
