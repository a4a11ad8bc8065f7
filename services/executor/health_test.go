package executor

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/health"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// withHealth gives f's executor the fleet's view of its deployments'
// health (not watching: its own writes are what it reads).
func (f *fixture) withHealth() *health.Registry {
	var deps []health.Deployment
	for _, p := range f.s.cfg.App.Providers {
		for _, m := range p.Models {
			deps = append(deps, health.Deployment{Provider: p.Name, Model: m.Name})
		}
	}
	r := health.New(health.Config{KV: f.m.Budgets, Deployments: deps, Holder: "test", Changes: f.s.m.DeploymentChanges,
		Pause: f.m.PauseDispatch, Pauses: f.s.m.Pauses})
	f.s.cfg.Health = r
	return r
}

// A Retry-After cools the deployment for the fleet as long as it asks, and
// pauses its dispatch; the job goes back without spending an attempt.
func TestRetryAfterCoolsTheDeployment(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(429, http.Header{"Retry-After": {"5"}}, `{"error":{"type":"requests","code":"rate_limit_exceeded","message":"Rate limit reached"}}`))
	reg := f.withHealth()
	j := f.job(t, "t")
	before := time.Now()
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	rec, _ := reg.Get("p", "m")
	if rec.State != health.Cooling || rec.Until.Before(before.Add(5*time.Second)) || rec.Reason != "rate_limited" {
		t.Fatalf("deployment %+v, want cooling for the 5 s asked", rec)
	}
	if q := f.queued(t); len(q.Attempts) != 0 || q.RateLimited != 1 {
		t.Fatalf("queued with attempts %+v, rate limited %d; want no attempt spent", q.Attempts, q.RateLimited)
	}
	if got := count(f.s.m.DeploymentChanges.WithLabelValues("p", "m", "cooling")); got != 1 {
		t.Fatalf("cooling changes %v, want 1", got)
	}
	if got := count(f.s.m.Pauses.WithLabelValues("p", "m")); got != 1 {
		t.Fatalf("pauses %v, want 1", got)
	}
}

// A refused key takes the deployment down; a model with no other
// deployment ends the job as before. A success after brings it up.
func TestRefusedKeyTakesTheDeploymentDown(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(401, nil, `{"error":{"type":"invalid_request_error","code":"invalid_api_key","message":"Incorrect API key provided"}}`))
	reg := f.withHealth()
	j := f.job(t, "t")
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if rec, _ := reg.Get("p", "m"); rec.State != health.Down || rec.Reason != "auth_401" {
		t.Fatalf("deployment %+v, want down for auth_401", rec)
	}
	if _, _, blocked := reg.Blocked("p", "m", time.Now()); !blocked {
		t.Fatal("a down deployment is not blocked")
	}
	if r := f.result(t, j); r.Status != job.StatusFailed {
		t.Fatalf("result %s, want failed: no other deployment serves the model", r.Status)
	}
	if got := count(f.s.m.DeploymentChanges.WithLabelValues("p", "m", "down")); got != 1 {
		t.Fatalf("down changes %v, want 1", got)
	}

	f.client.answer = answer(200, nil, okBody)
	if err := f.s.execute(context.Background(), &dispatched{}, f.job(t, "t")); err != nil {
		t.Fatal(err)
	}
	if rec, _ := reg.Get("p", "m"); rec.State != health.Up {
		t.Fatalf("deployment %+v after a success, want up", rec)
	}
	if got := count(f.s.m.DeploymentChanges.WithLabelValues("p", "m", "up")); got != 1 {
		t.Fatalf("up changes %v, want 1", got)
	}
}

// A model other deployments serve: a refused key or an endpoint that
// cannot be reached takes the deployment down and sends the job back to
// be placed again, its attempts untouched, its operation queued; nothing
// fails and nothing is dead-lettered.
func TestDownDeploymentGivesTheJobBack(t *testing.T) {
	t.Parallel()
	for name, ans := range map[string]func() (*provider.Response, error){
		"auth_401": answer(401, nil, `{"error":{"type":"invalid_request_error","code":"invalid_api_key","message":"Incorrect API key provided"}}`),
		"unreachable": func() (*provider.Response, error) {
			return nil, &provider.TransportError{Phase: provider.PhaseConnect, Err: syscall.ECONNREFUSED}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setupWith(t, `
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 1000, tpm: 1000000}]
  - name: q
    base_url: http://127.0.0.1:2/v1
    models: [{name: m, rpm: 1000, tpm: 1000000}]
tenants: [{name: t}]
`, ans)
			reg := f.withHealth()
			j := f.job(t, "t")
			if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
				t.Fatal(err)
			}
			if rec, _ := reg.Get("p", "m"); rec.State != health.Down || rec.Reason != name {
				t.Fatalf("deployment %+v, want down for %s", rec, name)
			}
			q := f.queued(t)
			if q.ID != j.ID || len(q.Attempts) != 0 || q.Reservation != nil || q.NotBefore != nil {
				t.Fatalf("queued %s with attempts %+v, reservation %+v, not_before %v; want the job back, nothing spent, no wait", q.ID, q.Attempts, q.Reservation, q.NotBefore)
			}
			if op := f.op(t, j); op.State != mesh.OpQueued || op.Sent != nil {
				t.Fatalf("operation %s, sent %v; want queued again", op.State, op.Sent)
			}
			if _, err := f.m.StoredResult(context.Background(), j.Tenant, j.ID); err == nil {
				t.Fatal("a result was stored; want none: the job is placed again")
			}
			if got := count(f.s.m.DeadLetters.WithLabelValues(name)); got != 0 {
				t.Fatalf("dead letters %v, want 0", got)
			}
		})
	}
}

// On a model with one deployment, what is the deployment's problem ends
// the job at once (one attempt, not a retry on the job's clock) with an
// error naming the deployment, never the endpoint's address or the
// resolver's, and takes the deployment down (issue 37).
func TestOperatorSideFailuresNameTheDeployment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, code, reason string
		ans                func() (*provider.Response, error)
	}{
		{"refused key", job.CodeDeploymentAuth, "auth_403", answer(403, nil, `{"error":{"type":"permission_error","message":"key sk-abc lacks access"}}`)},
		{"name does not resolve", job.CodeDeploymentUnreachable, "unreachable", func() (*provider.Response, error) {
			return nil, &provider.TransportError{Phase: provider.PhaseConnect,
				Err: &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "api.example.invalid", Server: "10.0.0.53:53", IsNotFound: true}}}
		}},
		{"quota", "insufficient_quota", "quota", answer(429, nil, `{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota"}}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, tc.ans)
			reg := f.withHealth()
			j := f.job(t, "t")
			if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
				t.Fatal(err)
			}
			if rec, _ := reg.Get("p", "m"); rec.State != health.Down || rec.Reason != tc.reason {
				t.Fatalf("deployment %+v, want down for %s", rec, tc.reason)
			}
			r := f.result(t, j)
			if r.Status != job.StatusFailed || r.Error == nil || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, "deployment p/m") || r.Attempts != 1 {
				t.Fatalf("result %s after %d attempts, error %+v; want failed %s naming deployment p/m after 1", r.Status, r.Attempts, r.Error, tc.code)
			}
			for _, leak := range []string{"10.0.0.53", "example.invalid", "sk-abc", "127.0.0.1"} {
				if strings.Contains(r.Error.Message, leak) {
					t.Errorf("the caller's error names %q: %s", leak, r.Error.Message)
				}
			}
		})
	}
}

// A pooled connection that closed before a byte of the request was
// written says nothing about the endpoint (it answered a moment ago): the
// deployment stays up and the job is retried, its call never having left.
func TestConnectionClosedIsNotUnreachable(t *testing.T) {
	t.Parallel()
	f := setup(t, func() (*provider.Response, error) {
		return nil, &provider.TransportError{Phase: provider.PhaseConnect, Err: fmt.Errorf("%w: %w", provider.ErrConnLost, io.EOF)}
	})
	reg := f.withHealth()
	j := f.job(t, "t")
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if rec, _ := reg.Get("p", "m"); rec.State == health.Down {
		t.Fatalf("deployment %+v, want not down", rec)
	}
	if q := f.queued(t); q.ID != j.ID || q.NotBefore == nil || len(q.Attempts) != 1 {
		t.Fatalf("queued %s with not_before %v, attempts %+v; want the job retried", q.ID, q.NotBefore, q.Attempts)
	}
}
