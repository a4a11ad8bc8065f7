package systest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// jobsConfig: a paced model (one call every 5 s) and a slow one (every call
// takes 6 s).
const jobsConfig = `
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: gpt-4o-mini, rpm: 12, tpm: 100000000, max_concurrency: 64, adaptive: false}
  - name: slow
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: slow-model, rpm: 100000, tpm: 100000000, max_concurrency: 64}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
`

type jobsSetup struct {
	n          Node
	cl         *client.Client
	fast, slow *sim.Server
	acme       *client.Jobs
	globex     *client.Jobs
}

func startJobs(t *testing.T) jobsSetup {
	t.Helper()
	var s jobsSetup
	var fastURL, slowURL string
	s.fast, fastURL = StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1000000, TPM: 1000000000}}, APIKeys: []string{"sim-secret"}})
	s.slow, slowURL = StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "slow-model", RPM: 1000000, TPM: 1000000000}}, APIKeys: []string{"sim-secret"}, TTFT: 6 * time.Second})
	s.n = Start(t, fmt.Sprintf(jobsConfig, fastURL, slowURL), Env)
	_, s.cl = s.n.Connect(t)
	s.acme, s.globex = client.NewJobs(s.n.HTTP, "acme-key"), client.NewJobs(s.n.HTTP, "globex-key")
	return s
}

// sent reports whether the simulator s received a request holding marker.
func sent(s *sim.Server, marker string) bool {
	return slices.ContainsFunc(s.Requests(), func(r sim.Request) bool { return strings.Contains(string(r.Body), marker) })
}

func body(model, marker string, stream bool) []byte {
	return fmt.Appendf(nil, `{"model":%q,"max_tokens":16,"stream":%v,"messages":[{"role":"user","content":%q}]}`, model, stream, marker)
}

// TestCancelQueuedAndList: a queued job cancelled ends cancelled at once
// and is never sent (the jobs behind it are, and it is not among the
// simulator's requests); a finished job cannot be cancelled (409), nor
// another tenant's (404). GET /v1/jobs lists the caller's own jobs only,
// newest first, by status, a page at a time.
func TestCancelQueuedAndList(t *testing.T) {
	t.Parallel()
	s := startJobs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var ids []string
	for i := range 4 {
		id, err := s.cl.Submit(ctx, &job.Job{Tenant: "acme", Request: body("gpt-4o-mini", fmt.Sprintf("job-%d", i), false)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	other, err := s.cl.Submit(ctx, &job.Job{Tenant: "globex", Request: body("gpt-4o-mini", "globex-job", false)})
	if err != nil {
		t.Fatal(err)
	}
	// The model takes a call every 5 s: one of acme's jobs may leave at
	// once, the others wait for the pace. Cancel the newest one still
	// queued, once ingest has recorded it. On a loaded machine ingest may
	// record them seconds apart, so more than one may have left by then:
	// a job whose call has left (409 job_running) or is done is skipped.
	victim := -1
	natstest.Eventually(t, 30*time.Second, func() error {
		for i := len(ids) - 1; i >= 0; i-- {
			got, accepted, err := s.acme.Cancel(ctx, ids[i])
			var apiErr *client.APIError
			switch {
			case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusNotFound:
				return err
			case errors.As(err, &apiErr) && (apiErr.Code == "job_finished" || apiErr.Code == "job_running"):
				continue // one that left already
			case err != nil || accepted || got.Status != job.StatusCancelled:
				t.Fatalf("cancel a queued job: got %+v accepted %v err %v; want cancelled", got, accepted, err)
			}
			victim = i
			return nil
		}
		t.Fatalf("every one of %d jobs on a model paced at one call every 5 s finished at once", len(ids))
		return nil
	})
	rest := slices.Delete(slices.Clone(ids), victim, victim+1)
	if res := JobResult(t, s.n, ids[victim]); res.Status != job.StatusCancelled || res.Error == nil || res.Error.Code != job.CodeCancelled {
		t.Fatalf("cancelled job's result: %+v", res)
	}
	// Another tenant's job is not found; a job submitted after the
	// cancellation goes through in the cancelled one's place.
	var apiErr *client.APIError
	if _, _, err := s.globex.Cancel(ctx, ids[0]); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("cancel another tenant's job: got %v; want 404", err)
	}
	after, err := s.cl.Submit(ctx, &job.Job{Tenant: "acme", Request: body("gpt-4o-mini", "job-after", false)})
	if err != nil {
		t.Fatal(err)
	}
	// Six calls at one every 5 s: the last may be half a minute away.
	for _, id := range append(rest, after) {
		if res := JobResultWithin(t, s.n, id, "60s"); res.Status != job.StatusSucceeded {
			t.Fatalf("job %s: %s %+v", id, res.Status, res.Error)
		}
	}
	if got := GetJob(t, ctx, s.n.HTTP, "globex-key", other, "20s"); got["status"] != string(job.StatusSucceeded) {
		t.Fatalf("globex's job: %v", got)
	}
	if sent(s.fast, fmt.Sprintf("job-%d", victim)) {
		t.Error("the cancelled job reached the provider")
	}
	if !sent(s.fast, "job-after") {
		t.Error("the job after it did not reach the provider")
	}
	if _, _, err := s.acme.Cancel(ctx, rest[0]); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Code != "job_finished" {
		t.Errorf("cancel a finished job: got %v; want 409 job_finished", err)
	}
	checkList(t, ctx, s.acme, append(ids, after), ids[victim])
}

// checkList pages through the tenant's jobs two at a time: exactly mine,
// newest first; status=cancelled gives the cancelled one only.
func checkList(t *testing.T, ctx context.Context, c *client.Jobs, mine []string, cancelled string) {
	t.Helper()
	var listed []string
	pages := 0
	opts := client.ListOptions{Limit: 2}
	for {
		page, err := c.List(ctx, opts)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		pages++
		for _, j := range page.Data {
			listed = append(listed, j.ID)
		}
		if !page.HasMore {
			break
		}
		if page.LastID == "" || pages > 10 {
			t.Fatalf("list: page %d has more without a last id (%+v)", pages, page)
		}
		opts.After = page.LastID
	}
	want := slices.Clone(mine)
	slices.Sort(want)
	slices.Reverse(want)
	if wantPages := (len(mine) + 1) / 2; !slices.Equal(listed, want) || pages != wantPages {
		t.Errorf("list in pages of 2: got %v in %d pages, want %v in %d", listed, pages, want, wantPages)
	}
	page, err := c.List(ctx, client.ListOptions{Status: job.StatusCancelled})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != cancelled || page.Data[0].Status != job.StatusCancelled {
		t.Errorf("list status=cancelled: got %+v %v, want %s only", page, err, cancelled)
	}
	page, err = c.List(ctx, client.ListOptions{Status: job.StatusSucceeded})
	if err != nil || len(page.Data) != len(mine)-1 {
		t.Errorf("list status=succeeded: got %+v %v, want %d jobs", page, err, len(mine)-1)
	}
}

// TestCancelRunning: a running streamed job is stopped (its upstream call
// aborted) and ends cancelled; a running job that is not streamed cannot
// be stopped: 409 job_running, and it runs to its end.
func TestCancelRunning(t *testing.T) {
	t.Parallel()
	s := startJobs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plain, err := s.cl.Submit(ctx, &job.Job{Tenant: "acme", Request: body("slow-model", "plain", false)})
	if err != nil {
		t.Fatal(err)
	}
	streamed, err := s.cl.Submit(ctx, &job.Job{Tenant: "acme", Request: body("slow-model", "streamed", true)})
	if err != nil {
		t.Fatal(err)
	}
	// Running: the provider has the call (a loaded executor may refuse its
	// own late send and place the job again, and until the call has left
	// a cancel rightly wins), and the list shows it running.
	running := func(id, marker string) {
		natstest.Eventually(t, 30*time.Second, func() error {
			if !sent(s.slow, marker) {
				return fmt.Errorf("the provider has not received %s yet", marker)
			}
			page, err := s.acme.List(ctx, client.ListOptions{Status: job.StatusRunning})
			if err != nil {
				return err
			}
			for _, j := range page.Data {
				if j.ID == id {
					return nil
				}
			}
			return fmt.Errorf("job %s not running yet (running: %+v)", id, page.Data)
		})
	}
	running(plain, "plain")
	var apiErr *client.APIError
	if _, _, err := s.acme.Cancel(ctx, plain); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Code != "job_running" {
		t.Errorf("cancel a running call: got %v; want 409 job_running", err)
	}
	running(streamed, "streamed")
	got, _, err := s.acme.Cancel(ctx, streamed)
	if err != nil {
		t.Fatalf("cancel a running stream: %v", err)
	}
	if res := JobResult(t, s.n, streamed); res.Status != job.StatusCancelled {
		t.Errorf("running stream cancelled: answer %+v, result %s %+v; want cancelled", got, res.Status, res.Error)
	}
	if res := JobResult(t, s.n, plain); res.Status != job.StatusSucceeded {
		t.Errorf("running call not cancelled: got %s %+v, want succeeded", res.Status, res.Error)
	}
}
