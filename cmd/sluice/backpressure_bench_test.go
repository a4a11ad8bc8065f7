package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// The backpressure benchmark is the acceptance test for bounded intake:
// `sluice up` runs as its own OS process (so its memory can be read from
// /proc) with an embedded NATS server, against the provider simulator on
// loopback, with a TPM-bound model and small queue bounds. Two producers
// offer 10x the model's quota for 60 s between them: tenant acme over NATS
// (pkg/client), tenant globex over HTTP (POST /v1/jobs). Run it with
//
//	go test -run XXX -bench Backpressure -benchtime 1x -timeout 20m ./cmd/sluice/
//
// It takes about 2 minutes. It fails if no refusal comes, if a refused call
// takes longer than bpPromptly (p99), if the process's peak RSS passes
// bpRSSBound, if an accepted job ends with no result or more than one, or if
// a refused job runs or leaves a record.
const (
	bpModel     = "bp-model"
	bpTPM       = 60_000                            // the binding limit
	bpJobTokens = 200                               // what admission reserves per job: ~47 prompt + 150 max_tokens
	bpQuota     = float64(bpTPM) / bpJobTokens / 60 // jobs per second the quota allows: 5
	bpOffer     = 10                                // offered load, times the quota
	bpFor       = 60 * time.Second                  // how long the producers offer
	bpRSSBound  = 128 << 20                         // the sluice process's peak RSS (VmHWM) must stay under this: about 75 MiB measured, 25 MiB of it at start
	bpPromptly  = time.Second                       // p99 latency of a refused submission
	bpDrain     = 4 * time.Minute                   // longest wait for the accepted jobs' results
	bpQueues    = "queues:\n" +                     // small bounds: INTAKE and QUEUE fill in seconds
		"  intake: {max_msgs: 400, max_bytes: 4194304, max_per_tenant: 100}\n" +
		"  queue: {max_msgs: 400, max_bytes: 4194304, max_per_tenant: 100}\n"
)

// bpSide is what one producer saw.
type bpSide struct {
	name                 string
	offered              int
	accepted, refused    []string // job ids
	acceptLat, refuseLat []time.Duration
	retryAfter           []time.Duration
	firstRefusal         time.Duration // from the first submission of the run; 0: none
	codes                map[string]int
	errs                 int
	lastErr              error
	mu                   sync.Mutex
}

func (s *bpSide) record(id string, lat time.Duration, refused bool, retry time.Duration, code string, runStart time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if refused {
		s.refused = append(s.refused, id)
		s.refuseLat = append(s.refuseLat, lat)
		s.retryAfter = append(s.retryAfter, retry)
		s.codes[code]++
		if s.firstRefusal == 0 {
			s.firstRefusal = time.Since(runStart)
		}
		return
	}
	s.accepted = append(s.accepted, id)
	s.acceptLat = append(s.acceptLat, lat)
}

// pct returns the p-th percentile (0..100) of ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// offer calls submit at rate per second for d, each call with a new job id.
func offer(ctx context.Context, rate float64, d time.Duration, submit func(id string)) int {
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	n := 0
	for ; time.Since(start) < d && natstest.Pace(ctx, start, n, interval); n++ {
		submit(job.NewID())
	}
	return n
}

// procMem reads VmRSS and VmHWM (peak RSS) of a process, in bytes.
func procMem(pid int) (rss, hwm int64, err error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm, nil
}

func BenchmarkBackpressure(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs /proc to read the sluice process's memory")
	}
	for range b.N {
		backpressure(b)
	}
}

func backpressure(b *testing.B) {
	bin := sluiceBinary(b)
	simSrv, simURL := systest.StartSim(b, sim.Config{Models: []sim.ModelLimits{{Name: bpModel, RPM: 10_000, TPM: bpTPM}},
		TTFT: 50 * time.Millisecond, APIKeys: []string{"sim-secret"}})
	dir := b.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(systest.SimConfig(simURL, bpModel, 10_000, bpTPM, bpQueues)), 0o600); err != nil {
		b.Fatal(err)
	}
	node := startChild(b, bin, []string{"--config", cfgPath, "--data", filepath.Join(dir, "data"),
		"--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "warn"}, systest.Env)
	pid := node.cmd.Process.Pid
	baseRSS, _, err := procMem(pid)
	if err != nil {
		b.Fatal(err)
	}
	nc, cl := node.Connect(b)

	// Every result, counted per job, from before the first submission.
	var rmu sync.Mutex
	results := map[string]int{}
	statuses := map[job.Status]int{}
	sub, err := nc.Subscribe(job.ResultPrefix+">", func(m *nats.Msg) {
		var r job.Result
		if json.Unmarshal(m.Data, &r) == nil {
			rmu.Lock()
			results[r.JobID]++
			statuses[r.Status]++
			rmu.Unlock()
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)

	// Memory, sampled until the end of the run.
	var peakRSS int64
	memDone := make(chan struct{})
	memStopped := make(chan struct{})
	go func() {
		defer close(memStopped)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, _, err := procMem(pid); err == nil {
				peakRSS = max(peakRSS, rss)
			}
			select {
			case <-memDone:
				return
			case <-t.C:
			}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), bpFor+bpDrain+time.Minute)
	defer cancel()
	body := systest.ChatBody(bpModel, 40, 150)
	perProducer := bpOffer * bpQuota / 2
	natsSide := &bpSide{name: "nats", codes: map[string]int{}}
	httpSide := &bpSide{name: "http", codes: map[string]int{}}
	hc := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		natsSide.offered = offer(ctx, perProducer, bpFor, func(id string) {
			t0 := time.Now()
			_, err := cl.Submit(ctx, &job.Job{ID: id, Tenant: "acme", Request: body})
			lat := time.Since(t0)
			var qf *client.QueueFullError
			switch {
			case err == nil:
				natsSide.record(id, lat, false, 0, "", start)
			case errors.As(err, &qf):
				natsSide.record(id, lat, true, qf.RetryAfter, "10077", start)
			default:
				natsSide.mu.Lock()
				natsSide.errs++
				natsSide.lastErr = err
				natsSide.mu.Unlock()
			}
		})
	}()
	go func() {
		defer wg.Done()
		httpSide.offered = offer(ctx, perProducer, bpFor, func(id string) {
			env, _ := json.Marshal(job.Job{ID: id, Request: body})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, node.HTTP+"/v1/jobs", bytes.NewReader(env))
			req.Header.Set("Authorization", "Bearer globex-key")
			req.Header.Set("Content-Type", "application/json")
			t0 := time.Now()
			resp, err := hc.Do(req)
			lat := time.Since(t0)
			if err != nil {
				httpSide.mu.Lock()
				httpSide.errs++
				httpSide.lastErr = err
				httpSide.mu.Unlock()
				return
			}
			var e struct{ Error struct{ Code string } }
			_ = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusAccepted:
				httpSide.record(id, lat, false, 0, "", start)
			case http.StatusTooManyRequests:
				ms, _ := strconv.ParseInt(resp.Header.Get("retry-after-ms"), 10, 64)
				httpSide.record(id, lat, true, time.Duration(ms)*time.Millisecond, e.Error.Code, start)
			default:
				httpSide.mu.Lock()
				httpSide.errs++
				httpSide.lastErr = fmt.Errorf("POST /v1/jobs: %d %s", resp.StatusCode, e.Error.Code)
				httpSide.mu.Unlock()
			}
		})
	}()
	wg.Wait()
	offeredFor := time.Since(start)

	// Every accepted job must reach exactly one result; no refused one may.
	sides := []*bpSide{natsSide, httpSide}
	var accepted, refused []string
	for _, s := range sides {
		accepted = append(accepted, s.accepted...)
		refused = append(refused, s.refused...)
	}
	drainStart := time.Now()
	missing := func() []string {
		rmu.Lock()
		defer rmu.Unlock()
		var out []string
		for _, id := range accepted {
			if results[id] == 0 {
				out = append(out, id)
			}
		}
		return out
	}
	drain, stop := context.WithTimeout(ctx, bpDrain)
	natstest.Poll(drain, func() bool { return len(missing()) == 0 })
	stop()
	drained := time.Since(drainStart)
	if len(missing()) == 0 {
		// A second result, if any, comes from a job still in a stream.
		systest.AllResultsIn(b, nc, sub, time.Minute)
	}
	// A result the subscription missed is still stored: not lost.
	for _, id := range missing() {
		if r, err := cl.Lookup(ctx, "acme", id); err == nil && r != nil {
			rmu.Lock()
			results[id] = 1
			rmu.Unlock()
		}
	}
	close(memDone)
	<-memStopped
	_, hwm, err := procMem(pid)
	if err != nil {
		b.Fatal(err)
	}

	// Refused HTTP jobs left no record: GET says 404.
	leftovers, checked := 0, 0
	for i := 0; i < len(httpSide.refused); i += max(1, len(httpSide.refused)/200) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, node.HTTP+"/v1/jobs/"+httpSide.refused[i], nil)
		req.Header.Set("Authorization", "Bearer globex-key")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		checked++
		if resp.StatusCode != http.StatusNotFound {
			leftovers++
		}
	}

	st := simSrv.Stats()
	ms := st.Models[bpModel]
	totalOffered := natsSide.offered + httpSide.offered
	b.Logf("quota %.1f jobs/s (%d TPM at %d tokens a job); offered %.0fx for %s; queues: intake 100 per tenant / 400, queue 100 per tenant and priority / 400",
		bpQuota, bpTPM, bpJobTokens, float64(totalOffered)/offeredFor.Seconds()/bpQuota, offeredFor.Round(time.Second))
	for _, s := range sides {
		b.Logf("%-4s offered %4d  accepted %4d  refused %4d %v  errors %d  first refusal after %s  refused call p50 %s p99 %s max %s  accepted call p50 %s p99 %s  retry-after min %s p50 %s max %s",
			s.name, s.offered, len(s.accepted), len(s.refused), s.codes, s.errs, s.firstRefusal.Round(10*time.Millisecond),
			pct(s.refuseLat, 50).Round(10*time.Microsecond), pct(s.refuseLat, 99).Round(10*time.Microsecond), pct(s.refuseLat, 100).Round(10*time.Microsecond),
			pct(s.acceptLat, 50).Round(10*time.Microsecond), pct(s.acceptLat, 99).Round(10*time.Microsecond),
			pct(s.retryAfter, 0), pct(s.retryAfter, 50), pct(s.retryAfter, 100))
		if s.lastErr != nil {
			b.Logf("%s: last error: %v", s.name, s.lastErr)
		}
	}
	rmu.Lock()
	var lost, dup, refusedRan int
	for _, id := range accepted {
		switch n := results[id]; {
		case n == 0:
			lost++
		case n > 1:
			dup++
		}
	}
	for _, id := range refused {
		if results[id] > 0 {
			refusedRan++
		}
	}
	b.Logf("results: %d accepted jobs, %d with one result %v, %d with none, %d with more than one; %d refused jobs got a result; all drained %s after offering stopped",
		len(accepted), len(accepted)-lost-dup, statuses, lost, dup, refusedRan, drained.Round(time.Second))
	rmu.Unlock()
	b.Logf("provider: %d requests admitted, %d answered 429, busiest 60 s %d tokens (limit %d), %d duplicate completions",
		ms.Admitted, ms.RateLimited, ms.MaxTokensIn60s, bpTPM, st.DuplicateCompletions)
	b.Logf("sluice process (pid %d): RSS %.1f MiB when ready, peak sampled %.1f MiB, VmHWM %.1f MiB; bound %d MiB",
		pid, float64(baseRSS)/(1<<20), float64(peakRSS)/(1<<20), float64(hwm)/(1<<20), bpRSSBound>>20)
	b.Logf("refused HTTP jobs looked up: %d of %d checked still have a record", leftovers, checked)

	b.ReportMetric(float64(totalOffered), "offered")
	b.ReportMetric(float64(len(accepted)), "accepted")
	b.ReportMetric(float64(len(refused)), "refused")
	b.ReportMetric(natsSide.firstRefusal.Seconds(), "nats-first-refusal-s")
	b.ReportMetric(httpSide.firstRefusal.Seconds(), "http-first-refusal-s")
	b.ReportMetric(float64(pct(natsSide.refuseLat, 99).Microseconds())/1000, "nats-refused-p99-ms")
	b.ReportMetric(float64(pct(httpSide.refuseLat, 99).Microseconds())/1000, "http-refused-p99-ms")
	b.ReportMetric(pct(natsSide.retryAfter, 50).Seconds(), "nats-retry-after-p50-s")
	b.ReportMetric(pct(httpSide.retryAfter, 50).Seconds(), "http-retry-after-p50-s")
	b.ReportMetric(float64(hwm)/(1<<20), "peak-rss-MiB")
	b.ReportMetric(float64(lost), "lost")

	for _, s := range sides {
		if len(s.refused) == 0 {
			b.Errorf("%s: no submission was refused at %dx the quota; the bounds did not bind", s.name, bpOffer)
		}
		if p := pct(s.refuseLat, 99); p > bpPromptly {
			b.Errorf("%s: refused calls took %s at p99, want under %s", s.name, p, bpPromptly)
		}
		if s.errs > 0 {
			b.Errorf("%s: %d submissions failed other than by a refusal (last: %v)", s.name, s.errs, s.lastErr)
		}
	}
	if hwm > bpRSSBound {
		b.Fatalf("the sluice process peaked at %.1f MiB RSS, above the %d MiB bound", float64(hwm)/(1<<20), bpRSSBound>>20)
	}
	if lost > 0 || dup > 0 {
		b.Fatalf("%d accepted jobs have no result after %s and %d have more than one", lost, bpDrain, dup)
	}
	if refusedRan > 0 || leftovers > 0 {
		b.Fatalf("%d refused jobs got a result and %d refused HTTP jobs left a record", refusedRan, leftovers)
	}
}
