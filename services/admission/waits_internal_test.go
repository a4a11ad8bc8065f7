package admission

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

func TestWaitReasonNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ prefix, bound, want string }{
		{"tenant_", "rpm", "tenant_rpm"}, {"tenant_", "tpm", "tenant_tpm"}, {"tenant_", "burst", "tenant_burst"},
		{"tenant_day_", "rpm", "tenant_rpd"}, {"tenant_day_", "tpm", "tenant_tpd"},
		{"model_day_", "rpm", "model_rpd"}, {"model_day_", "tpm", "model_tpd"},
	} {
		if got := gateReason(tc.prefix, tc.bound); got != tc.want {
			t.Errorf("gateReason(%q, %q): got %q, want %q", tc.prefix, tc.bound, got, tc.want)
		}
	}
	for _, tc := range []struct {
		j    task.Task
		want string
	}{
		{task.Task{}, "not_before"},
		{task.Task{Attempts: []job.Attempt{{}}}, "retry_backoff"},
		{task.Task{Requeued: &task.Requeued{Reason: "tenant_slot"}}, "tenant_concurrency"},
		{task.Task{Requeued: &task.Requeued{Reason: "breaker_open"}}, "breaker_open"},
		// Sent back before a later call: the call's backoff, not the old reason.
		{task.Task{Requeued: &task.Requeued{Reason: "tenant_slot"}, Attempts: []job.Attempt{{}}}, "retry_backoff"},
	} {
		if got := notBeforeReason(&tc.j); got != tc.want {
			t.Errorf("notBeforeReason(%+v): got %q, want %q", tc.j, got, tc.want)
		}
	}
}

// TestShareAndPosition: a tenant's weighted share among the tenants with
// jobs waiting, and a job's place among its own tenant's jobs only.
func TestShareAndPosition(t *testing.T) {
	t.Parallel()
	weights := map[string]int{"a": 1, "b": 3}
	s := NewScheduler(100, func(t string) int { return weights[t] }, nil, 0)
	if share, others := s.Share("a"); share != 1 || others {
		t.Errorf("empty: got %v %v, want 1 false", share, others)
	}
	var items []*Item
	for i, ten := range []string{"a", "b", "a", "b", "a"} {
		it := &Item{Tenant: ten, Priority: job.Standard, Cost: 10, Value: i}
		s.Push(it)
		items = append(items, it)
	}
	if share, others := s.Share("a"); share != 0.25 || !others {
		t.Errorf("a's share: got %v %v, want 0.25 true", share, others)
	}
	for i, want := range []int{1, 1, 2, 2, 3} {
		if got := s.PositionOf(items[i].Tenant, items[i].Value); got != want {
			t.Errorf("item %d (%s): position %d, want %d", i, items[i].Tenant, got, want)
		}
	}
	if got := s.PositionOf("a", 99); got != 0 {
		t.Errorf("a job not waiting: position %d, want 0", got)
	}
}
