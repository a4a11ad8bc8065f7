package lane

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A line's end is decided as a synchronous call's answer would be.
func TestDecide(t *testing.T) {
	t.Parallel()
	app, err := config.Parse([]byte("providers: [{name: p, base_url: \"http://127.0.0.1:1/v1\", models: [{name: m}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	c := &finisher{env: &env{Service: &Service{cfg: Config{App: app}, now: func() time.Time { return now }}}}
	soon := now.Add(time.Millisecond)
	for _, tc := range []struct {
		name     string
		r        resultOf
		deadline *time.Time
		want     string
	}{
		{"succeeded", resultOf{CustomID: "0", Result: provider.LineSucceeded}, nil, resResult},
		{"overloaded", resultOf{CustomID: "0", Result: provider.LineErrored, Outcome: provider.Outcome{Class: provider.Overloaded, HTTPStatus: 503}}, nil, resRetry},
		{"overloaded, no time left", resultOf{CustomID: "0", Result: provider.LineErrored, Outcome: provider.Outcome{Class: provider.Overloaded, HTTPStatus: 503, RetryAfter: time.Second}}, &soon, resFailed},
		{"bad request", resultOf{CustomID: "0", Result: provider.LineErrored, Outcome: provider.Outcome{Class: provider.Fail, HTTPStatus: 400}}, nil, resFailed},
		{"expired", resultOf{CustomID: "0", Result: provider.LineExpired}, nil, resSync},
		{"cancelled", resultOf{CustomID: "0", Result: provider.LineCancelled}, nil, resSync},
		{"in no result file", resultOf{}, nil, resSync},
	} {
		h := &held{j: &task.Task{Job: job.Job{Priority: job.Batch, Deadline: tc.deadline}}}
		if got := c.decide(h, tc.r); got != tc.want {
			t.Errorf("%s: decided %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A batch takes one job of each tenant in turn: a tenant that queued
// first with many jobs does not fill the batch ahead of the others.
func TestByTenant(t *testing.T) {
	t.Parallel()
	jobs := map[string]*held{}
	var pending []string
	add := func(tenant string, n int) {
		for i := range n {
			key := fmt.Sprintf("%s.%d", tenant, i)
			jobs[key] = &held{j: &task.Task{Job: job.Job{Tenant: tenant}}}
			pending = append(pending, key)
		}
	}
	add("big", 4)
	add("small", 1)
	add("mid", 2)
	got := byTenant(pending, jobs)
	want := []string{"big.0", "small.0", "mid.0", "big.1", "mid.1", "big.2", "big.3"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if one := byTenant(pending[:4], jobs); !slices.Equal(one, pending[:4]) {
		t.Errorf("one tenant's jobs: %v, want arrival order", one)
	}
}
