package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/term"

	"github.com/sluice-dev/sluice/internal/bench"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/services/admission"
)

const demoModel = "gpt-4o-mini"

func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	rpm := fs.Int("rpm", 600, "the simulated provider's requests-per-minute limit")
	tpm := fs.Int("tpm", 120000, "the simulated provider's tokens-per-minute limit")
	load := fs.Float64("load", 1.3, "offered tokens as a multiple of one minute's TPM")
	timeout := fs.Duration("timeout", 3*time.Minute, "give up after this long")
	seed := fs.Uint64("seed", 42, "workload seed")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *rpm < 10 || *tpm < 5000 || *load <= 0 || *load > 5 {
		return errors.New("want --rpm >= 10, --tpm >= 5000 and 0 < --load <= 5")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	// The provider: a simulator with limits that bind.
	simSrv, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: demoModel, RPM: *rpm, TPM: *tpm}},
		TTFT: 150 * time.Millisecond, PerToken: time.Millisecond, Batch: sim.BatchConfig{Duration: demoBatchDuration}})
	if err != nil {
		return err
	}
	simURL, stopSim, err := serveLoopback(simSrv)
	if err != nil {
		return err
	}
	defer stopSim()

	// The mesh: embedded NATS on a free port, a fresh store, every service.
	dir, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// Development mode: the demo's HTTP API is on a loopback port of its
	// own and its callers name their tenant (X-Sluice-Tenant).
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
server:
  open: true
providers:
  - name: sim
    base_url: %s/v1
    models:
      - name: %s
        rpm: %d
        tpm: %d
        max_concurrency: 64
        price: {input_per_mtok: 0.15, output_per_mtok: 0.6}
        batch: {enabled: true, collect: 2s, poll: 1s}
tenants:
  - {name: acme}
  - {name: globex}
  - {name: initech}
`, simURL, demoModel, *rpm, *tpm)))
	if err != nil {
		return err
	}
	ready := make(chan node.Info, 1)
	nodeErr := make(chan error, 1)
	nodeCtx, stopNode := context.WithCancel(context.Background())
	go func() {
		nodeErr <- node.Run(nodeCtx, node.Options{Config: cfg, NATSListen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Data: dir,
			OnReady: func(i node.Info) { ready <- i }})
	}()
	defer func() {
		stopNode()
		<-nodeErr
	}()
	var info node.Info
	select {
	case info = <-ready:
	case err := <-nodeErr:
		return fmt.Errorf("start mesh: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	nc, err := nats.Connect(info.NATSURL, info.NATSOptions...)
	if err != nil {
		return err
	}
	defer nc.Close()
	cl, err := client.New(nc)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var (
		mu       sync.Mutex
		statuses = map[job.Status]int{}
		codes    = map[string]int{}
		laneJobs int
		laneCost float64
		retried  int // jobs that spent more than one attempt
		refusals = map[string]int{}
		done     atomic.Int64
	)
	sub, err := nc.Subscribe(job.ResultPrefix+">", func(m *nats.Msg) {
		var r job.Result
		if json.Unmarshal(m.Data, &r) != nil {
			return
		}
		mu.Lock()
		statuses[r.Status]++
		if r.Attempts > 1 {
			retried++
		}
		if r.Error != nil {
			codes[r.Error.Code]++
		}
		if r.Lane == job.LaneBatch {
			laneJobs++
			if r.Cost != nil {
				laneCost += *r.Cost
			}
		}
		mu.Unlock()
		done.Add(1)
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()

	jobs := demoWorkload(*seed, int(float64(*tpm)**load))
	fmt.Fprintf(stdout, "Sluice demo: %d jobs from 3 tenants (%d tokens reserved in all, %.1fx the minute's limit)\n",
		len(jobs), totalCost(jobs), *load)
	fmt.Fprintf(stdout, "provider simulator: %s limited to %d RPM / %d TPM, answering 429 beyond that\n", demoModel, *rpm, *tpm)
	fmt.Fprintf(stdout, "acme calls POST /v1/chat/completions (OpenAI API, %d calls at a time), globex publishes batch-priority jobs to NATS (sent through the batch lane to the simulator's Batch API, %s a batch), initech uses POST /v1/jobs\n\n", demoSyncCallers, demoBatchDuration)

	start := time.Now()
	base := "http://" + info.HTTPAddr
	var refused atomic.Int64
	var wg sync.WaitGroup
	// acme is an application with a pool of callers, each waiting for its
	// answer: a waiting call holds one of the tenant's waiter places
	// (limits.max_waiters_per_tenant, 100 by default), so it calls a
	// bounded number at a time, as a real client would.
	callers := make(chan struct{}, demoSyncCallers)
	for _, dj := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if dj.tenant == "acme" {
				callers <- struct{}{}
				defer func() { <-callers }()
			}
			if err := submitDemoJob(ctx, cl, base, dj); err != nil {
				refused.Add(1)
				mu.Lock()
				refusals[err.Error()]++
				mu.Unlock()
			}
		}()
	}
	// Two malformed jobs show what bad input gets: a clear error, no provider call.
	for _, bad := range []string{
		`{"model":"gpt-4o-mini","max_tokens":-5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`,
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(bad))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Sluice-Tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var e struct {
				Error struct{ Code, Message string }
			}
			_ = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			fmt.Fprintf(stdout, "bad input → HTTP %d %s: %s\n", resp.StatusCode, e.Error.Code, e.Error.Message)
		}
	}
	fmt.Fprintln(stdout)

	tty := false
	if f, ok := stdout.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	total := int64(len(jobs))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	finished := func() bool { return done.Load()+refused.Load() >= total }
	for !finished() {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout)
			return fmt.Errorf("demo did not finish within %s", *timeout)
		case <-tick.C:
		}
		st := simSrv.Stats().Models[demoModel]
		line := fmt.Sprintf("[%3.0fs] done %d/%d  queue %d  tokens in last 60s %s / %s (%3.0f%%)  provider 429s %d",
			time.Since(start).Seconds(), done.Load(), total, queueDepth(ctx, js), bench.Comma(trailing(st.Timeline, 60)), bench.Comma(int64(*tpm)),
			100*float64(trailing(st.Timeline, 60))/float64(*tpm), st.RateLimited)
		if tty {
			fmt.Fprintf(stdout, "\r%s\x1b[K", line)
		} else if int(time.Since(start).Seconds())%5 == 0 {
			fmt.Fprintln(stdout, line)
		}
	}
	wg.Wait()
	if tty {
		fmt.Fprintln(stdout)
	}
	elapsed := time.Since(start)
	st := simSrv.Stats()
	ms := st.Models[demoModel]
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(stdout, "\nSummary after %.0fs (provider figures from the simulator's own ledger)\n", elapsed.Seconds())
	fmt.Fprintf(stdout, "  jobs           %d submitted: %d succeeded, %d failed, %d expired, %d refused at submission\n",
		total, statuses[job.StatusSucceeded], statuses[job.StatusFailed], statuses[job.StatusExpired], refused.Load())
	fmt.Fprintf(stdout, "  provider saw   %d requests: %d answered 200, %d answered 429\n", ms.Admitted+ms.RateLimited, ms.Requests[200], ms.Requests[429])
	fmt.Fprintf(stdout, "  busiest 60 s   %s tokens (limit %s), %d requests (limit %d)\n", bench.Comma(int64(ms.MaxTokensIn60s)), bench.Comma(int64(*tpm)), ms.MaxRequestsIn60s, *rpm)
	fmt.Fprintf(stdout, "  busiest 1 s    %s tokens (cap %s), %d requests (cap %d)\n", bench.Comma(int64(ms.MaxTokensIn1s)), bench.Comma(int64(ms.BurstTokens)), ms.MaxRequestsIn1s, ms.BurstRequests)
	lines := map[string]int{}
	var lineTokens int64
	for _, l := range simSrv.BatchLines() {
		lines[l.Result]++
		lineTokens += int64(l.InputTokens + l.OutputTokens)
	}
	fmt.Fprintf(stdout, "  batch lane     %d jobs answered by %d batch lines, at half price: %.4f USD (%.4f at the sync price)\n",
		laneJobs, lines["succeeded"], laneCost, 2*laneCost)
	fmt.Fprintf(stdout, "  paid twice     %d operations\n", st.DuplicateCompletions)
	fmt.Fprintf(stdout, "  tokens used    %s (prompt + completion, as the provider reported; %s of them in batch lines) in %.0fs\n",
		bench.Comma(ms.SuccessTokens+lineTokens), bench.Comma(lineTokens), elapsed.Seconds())
	if err := demoVerdict(stdout, ms, *rpm, *tpm, retried); err != nil {
		return err
	}
	if n := refused.Load(); n > 0 {
		for why, k := range refusals {
			fmt.Fprintf(stdout, "  refused        %d: %s\n", k, why)
		}
		return fmt.Errorf("%d jobs were refused at submission", n)
	}
	if ms.RateLimited > 0 {
		// A call planned within the limits that reached the provider later
		// than send_tolerance after its instant (a starved machine) may
		// share a second with the calls after it: the provider refuses it,
		// and it goes back to its queue without spending an attempt.
		fmt.Fprintf(stdout, "\nEvery job got exactly one result; the provider never accepted more than its limits (it refused %d calls that went back to their queues, no attempt spent).\n", ms.RateLimited)
		return nil
	}
	fmt.Fprintln(stdout, "\nEvery job got exactly one result; the provider never saw more than its limits.")
	return nil
}

// demoVerdict fails the demo if the provider accepted more than its limits
// in any minute or second, or a job spent an attempt (the demo's provider
// has no faults, and a 429 costs none).
func demoVerdict(stdout io.Writer, ms sim.ModelStats, rpm, tpm, retried int) error {
	if ms.MaxTokensIn60s > tpm || ms.MaxAdmittedRequestsIn60s > rpm ||
		ms.MaxTokensIn1s > ms.BurstTokens || ms.MaxAdmittedRequestsIn1s > ms.BurstRequests {
		return errors.New("the provider accepted more than its limits")
	}
	if retried > 0 {
		fmt.Fprintf(stdout, "  retried        %d jobs\n", retried)
		return fmt.Errorf("%d jobs spent more than one attempt", retried)
	}
	return nil
}

// demoBatchDuration is how long the simulator takes over one batch.
const demoBatchDuration = 10 * time.Second

// demoSyncCallers is how many of acme's calls wait for their answers at
// once.
const demoSyncCallers = 32

type demoJob struct {
	tenant   string
	priority job.Priority
	body     []byte
	cost     int
}

func demoWorkload(seed uint64, budget int) []demoJob {
	rnd := rand.New(rand.NewPCG(seed, seed^0x5eed))
	words := strings.Fields("the quick brown fox jumps over a lazy dog while rate limits bind and tokens flow through queues fairly")
	var out []demoJob
	sum := 0
	for i := 0; sum < budget; i++ {
		n := 20 + rnd.IntN(220)
		var b strings.Builder
		for w := 0; w < n; w++ {
			b.WriteString(words[rnd.IntN(len(words))])
			b.WriteByte(' ')
		}
		maxTok := 64 + rnd.IntN(192)
		body, _ := json.Marshal(map[string]any{"model": demoModel, "max_tokens": maxTok,
			"messages": []map[string]string{{"role": "user", "content": b.String()}}})
		tenant := []string{"acme", "globex", "initech"}[i%3]
		prio := []job.Priority{job.Interactive, job.Batch, job.Standard}[i%3]
		cost := n + 10 + maxTok // close to the real estimate: about a token per word
		sum += cost
		out = append(out, demoJob{tenant: tenant, priority: prio, body: body, cost: cost})
	}
	return out
}

func totalCost(js []demoJob) int {
	n := 0
	for _, j := range js {
		n += j.cost
	}
	return n
}

func submitDemoJob(ctx context.Context, cl *client.Client, base string, dj demoJob) error {
	switch dj.tenant {
	case "acme": // the OpenAI-compatible endpoint, waiting for the answer
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(dj.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Sluice-Tenant", dj.tenant)
		req.Header.Set("X-Sluice-Priority", string(dj.priority))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK && resp.Header.Get("X-Sluice-Job-Id") == "" {
			// Refused before a job existed: no result will come.
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	case "globex": // NATS
		_, err := cl.Submit(ctx, &job.Job{Tenant: dj.tenant, Priority: dj.priority, Request: dj.body})
		return err
	default: // the jobs API
		env, _ := json.Marshal(job.Job{Tenant: dj.tenant, Priority: dj.priority, Request: dj.body})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/jobs", bytes.NewReader(env))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Sluice-Tenant", dj.tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	}
}

func queueDepth(ctx context.Context, js jetstream.JetStream) int {
	d, err := admission.QueueDepth(ctx, js)
	if err != nil {
		return -1
	}
	n := 0
	for _, v := range d {
		n += v
	}
	return n
}

func trailing(tl []sim.Second, n int) int64 {
	var sum int64
	for i := max(0, len(tl)-n); i < len(tl); i++ {
		sum += tl[i].ChargedTokens
	}
	return sum
}

// serveLoopback serves h on a free loopback port.
func serveLoopback(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
