package lane_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/lane"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

func TestEligible(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`providers:
  - name: a
    base_url: "http://127.0.0.1:1/v1"
    models: [{name: m, tier: 0}, {name: plain}]
  - name: b
    base_url: "http://127.0.0.1:2/v1"
    models: [{name: m, tier: 1, price: {input_per_mtok: 1, output_per_mtok: 4}, batch: {enabled: true, min_deadline: 1h, rescue: 10m}}]
tenants:
  - {name: free}
  - {name: capped, spend: {per_day: 5}}
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	for _, tc := range []struct {
		name string
		j    task.Task
		want string // the lane's provider, "" none
	}{
		{"no deadline", task.Task{Job: job.Job{Priority: job.Batch, Request: chat}, Model: "m"}, "b"},
		{"distant deadline", task.Task{Job: job.Job{Priority: job.Batch, Deadline: at(2 * time.Hour), Request: chat}, Model: "m"}, "b"},
		{"near deadline", task.Task{Job: job.Job{Priority: job.Batch, Deadline: at(59 * time.Minute), Request: chat}, Model: "m"}, ""},
		{"standard", task.Task{Job: job.Job{Priority: job.Standard, Request: chat}, Model: "m"}, ""},
		{"no lane", task.Task{Job: job.Job{Priority: job.Batch, Request: chat}, Model: "m", NoLane: true}, ""},
		{"streamed", task.Task{Job: job.Job{Priority: job.Batch, Request: []byte(`{"model":"m","stream":true,"messages":[]}`)}, Model: "m"}, ""},
		{"embeddings", task.Task{Job: job.Job{Priority: job.Batch, Endpoint: job.EndpointEmbeddings, Request: chat}, Model: "m"}, ""},
		{"pinned elsewhere", task.Task{Job: job.Job{Priority: job.Batch, Provider: "a", Request: chat}, Model: "m", Pinned: true}, ""},
		{"model without lane", task.Task{Job: job.Job{Priority: job.Batch, Request: chat}, Model: "plain"}, ""},
		{"tenant without spend budget", task.Task{Job: job.Job{Tenant: "free", Priority: job.Batch, Request: chat}, Model: "m"}, "b"},
		// The lane takes no spend hold: the budget would not see its cost.
		{"tenant with spend budget", task.Task{Job: job.Job{Tenant: "capped", Priority: job.Batch, Request: chat}, Model: "m"}, ""},
	} {
		p, _, ok := lane.Eligible(c, &tc.j, now)
		if p != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: got %q (%v), want %q", tc.name, p, ok, tc.want)
		}
	}
}

// TestKept: a collected job stays in its lane only while its tenant has no
// spend budget and its deployment's lane is on, as the configuration now
// says (a reload may have changed either).
func TestKept(t *testing.T) {
	t.Parallel()
	parse := func(tenantSpend, lane string) *config.Config {
		c, err := config.Parse(fmt.Appendf(nil, `providers:
  - name: b
    base_url: "http://127.0.0.1:2/v1"
    models: [{name: m, price: {input_per_mtok: 1, output_per_mtok: 4}, batch: {enabled: %s}}]
tenants:
  - {name: acme%s}
`, lane, tenantSpend))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name           string
		c              *config.Config
		provider, want string
	}{
		{"as collected", parse("", "true"), "b", "kept"},
		{"tenant given a spend budget", parse(", spend: {per_day: 5}", "true"), "b", ""},
		{"lane turned off", parse("", "false"), "b", ""},
		{"another provider's lane", parse("", "true"), "a", ""},
	} {
		if got := lane.Kept(tc.c, "acme", tc.provider, "m"); got != (tc.want != "") {
			t.Errorf("%s: Kept %v, want %v", tc.name, got, tc.want != "")
		}
	}
}
