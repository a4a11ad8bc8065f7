package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestUnitsEndToEnd: a model limited on a third unit (600 images a minute,
// so 10 a second; RPM and TPM generous, so only images bind) gets 60 jobs
// of 1-2 images through the whole mesh, over NATS (the envelope's "cost")
// and HTTP (X-Sluice-Cost). Every job succeeds, the simulator refuses
// nothing, and it never sees more images than the limit in any trailing
// minute or second. A job naming a unit the model does not limit is
// refused naming it.
func TestUnitsEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		model  = "painter"
		images = 600 // a minute: a quantum of 10 a second
		jobs   = 60  // 90 images: about 9 seconds of the quantum
	)
	simSrv, simURL := systest.StartSim(t, sim.Config{
		Models:  []sim.ModelLimits{{Name: model, RPM: 100_000, TPM: 100_000_000, Units: map[string]int{"images": images}}},
		TTFT:    10 * time.Millisecond,
		APIKeys: []string{"sim-secret"},
	})
	cfg := strings.Replace(systest.SimConfig(simURL, model, 100_000, 100_000_000, ""),
		"max_concurrency: 128}", fmt.Sprintf("max_concurrency: 128, units: {images: %d}, allow_fields: [sim_units]}", images), 1)
	n := systest.Start(t, cfg, systest.Env)
	nc, cl := n.Connect(t)

	var mu sync.Mutex
	statuses := map[string]job.Status{}
	sub, err := nc.Subscribe(job.ResultPrefix+">", func(m *nats.Msg) {
		var r job.Result
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("bad result: %v", err)
			return
		}
		mu.Lock()
		statuses[r.JobID] = r.Status
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The simulator reads a request's images from its body ("sim_units", a
	// provider's own field: the model's allow_fields lets it through);
	// Sluice from the job's cost. Both say the same.
	body := func(i, k int) []byte {
		b := systest.ChatBody(model, 10+i%20, 32)
		return append(b[:len(b)-1], fmt.Sprintf(`,"sim_units":{"images":%d}}`, k)...)
	}
	var ids sync.Map
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	want := 0
	for i := range jobs {
		k := 1 + i%2
		want += k
		switch {
		case i%10 == 9:
			// A chat completion over HTTP, its cost in X-Sluice-Cost.
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, err := chatWithCost(ctx, n.HTTP, "globex-key", body(i, k), fmt.Sprintf("images=%d", k))
				if err != nil {
					errs <- err
					return
				}
				ids.Store(id, k)
			}()
		default:
			id, err := cl.Submit(ctx, &job.Job{Tenant: []string{"acme", "initech"}[i%2], Request: body(i, k), Cost: map[string]int{"images": k}})
			if err != nil {
				t.Fatalf("submit #%d: %v", i, err)
			}
			ids.Store(id, k)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("chat completion: %v", err)
	}

	finished := func() int {
		mu.Lock()
		defer mu.Unlock()
		done := 0
		ids.Range(func(id, _ any) bool {
			if _, ok := statuses[id.(string)]; ok {
				done++
			}
			return true
		})
		return done
	}
	if !natstest.Poll(ctx, func() bool { return finished() == jobs }) {
		t.Fatalf("only %d of %d jobs finished", finished(), jobs)
	}
	mu.Lock()
	ids.Range(func(id, _ any) bool {
		if st := statuses[id.(string)]; st != job.StatusSucceeded {
			t.Errorf("job %s ended %s, want succeeded", id, st)
		}
		return true
	})
	mu.Unlock()

	st := simSrv.Stats()
	ms := st.Models[model]
	u := ms.Units["images"]
	t.Logf("images: %+v; requests %v", u, ms.Requests)
	if got := st.Requests[http.StatusTooManyRequests]; got != 0 || ms.RateLimited != 0 || u.RateLimited != 0 {
		t.Errorf("the simulator answered %d 429s (%d for images), want none", got, u.RateLimited)
	}
	if u.Charged != int64(want) {
		t.Errorf("the simulator charged %d images, want the %d the jobs stated", u.Charged, want)
	}
	if u.MaxIn60s > images {
		t.Errorf("the simulator saw %d images in a minute, limit %d", u.MaxIn60s, images)
	}
	if u.MaxIn1s > images/60 {
		t.Errorf("the simulator saw %d images in a second, quantum %d", u.MaxIn1s, images/60)
	}
	if ms.MaxRequestsIn1s > ms.BurstRequests || ms.MaxTokensIn1s > ms.BurstTokens {
		t.Errorf("requests or tokens over their quantum: %d/%d requests, %d/%d tokens in a second",
			ms.MaxRequestsIn1s, ms.BurstRequests, ms.MaxTokensIn1s, ms.BurstTokens)
	}

	// A unit the model does not limit is refused, naming it.
	code, msg := chatStatus(ctx, n.HTTP, "acme-key", systest.ChatBody(model, 5, 8), "videos=1")
	if code != http.StatusBadRequest || !strings.Contains(msg, `does not limit unit \"videos\"`) {
		t.Errorf("X-Sluice-Cost naming videos: HTTP %d %s; want 400 naming the unit", code, msg)
	}
}

// chatWithCost posts a chat completion with X-Sluice-Cost and returns its
// job id once it succeeded.
func chatWithCost(ctx context.Context, base, key string, body []byte, cost string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sluice-Cost", cost)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("chat completions: HTTP %d %s", resp.StatusCode, b)
	}
	return resp.Header.Get("X-Sluice-Job-Id"), nil
}

// chatStatus posts a chat completion with X-Sluice-Cost and returns the
// status and body of the answer.
func chatStatus(ctx context.Context, base, key string, body []byte, cost string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Sluice-Cost", cost)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
