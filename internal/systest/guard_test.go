package systest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// getJob reads GET /v1/jobs/{id} as tenant acme.
func getJobAs(t testing.TB, base, id string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/jobs/"+id, nil)
	req.Header.Set("Authorization", "Bearer acme-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, v
}

// waitJob polls a job until it has a terminal status.
func waitJobAs(t testing.TB, base, id string) map[string]any {
	t.Helper()
	var v map[string]any
	natstest.Eventually(t, 90*time.Second, func() error {
		code, got := getJobAs(t, base, id)
		v = got
		if st, _ := got["status"].(string); code != http.StatusOK || !job.Status(st).Terminal() {
			return fmt.Errorf("job %s not finished; last seen: %v", id, got)
		}
		return nil
	})
	return v
}

// TestForgedMessagesNeverReachTheProvider publishes on QUEUE and DISPATCH
// what a client allowed to publish there could forge (the issue's
// reproductions): nothing the configuration forbids reaches the provider,
// an estimate is never believed below the request's cost, and a poison
// message does not stop admission.
func TestForgedMessagesNeverReachTheProvider(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := StartLogged(t, SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, "limits: {max_tokens: 4096}\n"), Env)
	nc, _ := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	publish := func(subject string, j any) {
		t.Helper()
		data, _ := json.Marshal(j)
		msg := nats.NewMsg(subject)
		msg.Data = data
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
	}
	far := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	now := time.Now().UTC()

	// 1. DISPATCH: a model that is not configured, max_tokens 20,000 (the
	// limit is 4,096), valid until 2099, nothing reserved.
	forged := &task.Task{
		Job:         job.Job{ID: job.NewID(), Tenant: "acme", Priority: job.Standard, Provider: "sim", Request: json.RawMessage(`{"model":"gpt-9-unconfigured","max_tokens":20000,"messages":[{"role":"user","content":"hi"}]}`)},
		Model:       "gpt-4o-mini",
		Estimate:    &job.Estimate{PromptTokens: 1, MaxTokens: 1},
		Reservation: &task.Reservation{ID: "1-0", Requests: 1, Tokens: 2, ReservedAt: now, ValidUntil: far},
	}
	publish(job.DispatchSubject("sim", "gpt-4o-mini"), forged)
	// 2. The same with the request's model configured but max_tokens over
	// the limit.
	over := *forged
	over.ID = job.NewID()
	over.Request = json.RawMessage(`{"model":"gpt-4o-mini","max_tokens":20000,"messages":[{"role":"user","content":"hi"}]}`)
	publish(job.DispatchSubject("sim", "gpt-4o-mini"), &over)
	// 3. QUEUE: a tenant Sluice does not know.
	stranger := &task.Task{
		Job:      job.Job{ID: job.NewID(), Tenant: "mallory", Priority: job.Standard, Provider: "sim", Request: json.RawMessage(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`)},
		Model:    "gpt-4o-mini",
		Estimate: &job.Estimate{PromptTokens: 1, MaxTokens: 1},
	}
	publish(job.QueueSubject(job.Standard, "mallory"), stranger)
	// 4. QUEUE: a negative estimate (it panicked a counter and hung
	// admission for good).
	negative := &task.Task{
		Job:         job.Job{ID: job.NewID(), Tenant: "acme", Priority: job.Standard, Provider: "sim", Request: json.RawMessage(`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)},
		Model:       "gpt-4o-mini",
		SubmittedAt: now,
		Estimate:    &job.Estimate{PromptTokens: -1 << 40, MaxTokens: -1},
	}
	publish(job.QueueSubject(job.Standard, "acme"), negative)
	// 5. QUEUE: 1 + 1 tokens claimed for a request of about 15,000.
	long := &task.Task{
		Job:         job.Job{ID: job.NewID(), Tenant: "acme", Priority: job.Standard, Provider: "sim", Request: ChatBody("gpt-4o-mini", 15000, 16)},
		Model:       "gpt-4o-mini",
		SubmittedAt: now,
		Estimate:    &job.Estimate{PromptTokens: 1, MaxTokens: 1},
	}
	reservedBefore := MetricSum(t, n.MetricsURL(), "llm_tokens_reserved_total")
	publish(job.QueueSubject(job.Standard, "acme"), long)

	for _, id := range []string{forged.ID, over.ID} {
		v := waitJobAs(t, n.HTTP, id)
		res, _ := v["result"].(map[string]any)
		e, _ := res["error"].(map[string]any)
		if v["status"] != string(job.StatusFailed) || e["code"] != job.CodeInvalidRequest {
			t.Errorf("forged dispatch %s: got %v, want failed invalid_request", id, v)
		}
	}
	if v := waitJobAs(t, n.HTTP, long.ID); v["status"] != string(job.StatusSucceeded) {
		t.Errorf("long job: got %v, want succeeded", v)
	}
	reserved := MetricSum(t, n.MetricsURL(), "llm_tokens_reserved_total") - reservedBefore
	if reserved < 15000 {
		t.Errorf("tokens reserved for the long job claimed at 2 tokens: %.0f, want at least 15,000 (recomputed)", reserved)
	}
	if v := waitJobAs(t, n.HTTP, negative.ID); v["status"] != string(job.StatusSucceeded) {
		t.Errorf("job with a negative estimate: got %v, want succeeded once its estimate is recomputed", v)
	}
	// Admission still admits: a plain job after all of that completes.
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0))
	if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("still there?")}, MaxTokens: openai.Int(8)}); err != nil {
		t.Fatalf("a plain call after the forged messages: %v", err)
	}
	if code, _ := getJobAs(t, n.HTTP, stranger.ID); code != http.StatusNotFound {
		t.Errorf("job of an unknown tenant: GET answers %d, want 404 (nothing stored)", code)
	}
	st := simSrv.Stats()
	for _, id := range []string{forged.ID, over.ID, stranger.ID} {
		if st.JobCompletions[id] != 0 {
			t.Errorf("forged job %s reached the provider %d times, want 0", id, st.JobCompletions[id])
		}
	}
	if got := st.Completed; got != 3 {
		t.Errorf("provider completed %d calls, want 3 (the long job, the recomputed one, the plain call)", got)
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_jobs_rejected_total", `via="dispatch"`, `code="invalid_request"`); got != 2 {
		t.Errorf("dispatch rejections counted: %.0f, want 2", got)
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_jobs_rejected_total", `via="queue"`, `code="estimate_recomputed"`); got < 2 {
		t.Errorf("estimates recomputed counted: %.0f, want at least 2", got)
	}
}

// TestAnswerTooLargeIsPaidOnce: a provider answer larger than a result can
// hold (9 MiB, issue 11: paid 22 times in 25 s) is paid for once, through
// the official SDK on its default retries, and ends response_too_large.
func TestAnswerTooLargeIsPaidOnce(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"},
		PadResponseBytes: 9 << 20})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key")) // default retries
	var hdr http.Header
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me everything")}, MaxTokens: openai.Int(16)},
		option.WithResponseInto(new(*http.Response)), option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if resp != nil {
				hdr = resp.Header
			}
			return resp, err
		}))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.Code != job.CodeResponseTooLarge {
		t.Fatalf("got %v, want an API error with code %s", err, job.CodeResponseTooLarge)
	}
	id := hdr.Get("X-Sluice-Job-Id")
	if id == "" {
		t.Fatal("no X-Sluice-Job-Id on the answer")
	}
	v := waitJobAs(t, n.HTTP, id)
	if v["status"] != string(job.StatusFailed) {
		t.Errorf("job: got %v, want failed", v)
	}
	// A redelivery (the failure mode) would keep the job in DISPATCH.
	Quiet(t, n, 30*time.Second)
	st := simSrv.Stats()
	if st.Requests[http.StatusOK] != 1 || st.Completed != 1 {
		t.Errorf("provider answered %d calls (%d completed), want exactly 1: %s", st.Requests[http.StatusOK], st.Completed, fmt.Sprint(st.Requests))
	}
}
