package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
)

// BenchmarkClusterFaults runs the cluster fault scenarios from outside, as
// a new user would: three `sluice up` processes (one embedded NATS node
// each, --replicas 3, every service on every node), a provider that
// ignores Idempotency-Key and records every call, and 600 short jobs
// submitted over HTTP at 10 a second, each its own request (a client
// behind a load balancer: node 1 first, another node when node 1 does not
// answer at all). One iteration is one run:
//
//   - node-loss: node 2 is SIGKILLed at 20 s and restarted at 50 s;
//   - partition: node 2 is cut off from the other two at 20 s for 20 s;
//   - rolling-restart: from 15 s, each node in turn is stopped (SIGTERM)
//     and started again once the previous one is back.
//
// Each run fails on a refused submission, a lost job (no result within
// three minutes of the last submission), a prompt the provider completed
// twice, or a job with a result other than succeeded or outcome_unknown.
// It reports, per run, the jobs that ended outcome_unknown (calls in flight
// on the lost node). Run it with
//
//	go test -run '^$' -bench 'BenchmarkClusterFaults/node-loss' -benchtime 1x -count 10 -timeout 4h ./cmd/sluice/
//
// (each -count one run of about 2 minutes; not part of the suite).
func BenchmarkClusterFaults(b *testing.B) {
	for _, fault := range []string{"node-loss", "partition", "rolling-restart"} {
		b.Run(fault, func(b *testing.B) {
			var total faultRun
			for i := range b.N {
				r := runClusterFault(b, fault)
				b.Logf("run %d: %s", i+1, r)
				total.add(r)
			}
			b.Logf("%d runs: %s", b.N, total)
			n := float64(b.N)
			b.ReportMetric(float64(total.jobs)/n, "jobs/run")
			b.ReportMetric(float64(total.refused)/n, "refused/run")
			b.ReportMetric(float64(total.lost)/n, "lost/run")
			b.ReportMetric(float64(total.twice)/n, "paid-twice/run")
			b.ReportMetric(float64(total.unknown)/n, "outcome-unknown/run")
		})
	}
}

// faultRun is what one run of a fault scenario saw.
type faultRun struct {
	jobs, refused, lost, twice, unknown, succeeded, other int
	maxSubmit                                             time.Duration // slowest accepted submission
}

func (r *faultRun) add(o faultRun) {
	r.jobs += o.jobs
	r.refused += o.refused
	r.lost += o.lost
	r.twice += o.twice
	r.unknown += o.unknown
	r.succeeded += o.succeeded
	r.other += o.other
	r.maxSubmit = max(r.maxSubmit, o.maxSubmit)
}

func (r faultRun) String() string {
	return fmt.Sprintf("%d submitted, %d refused, %d lost, %d prompts paid twice; %d succeeded, %d outcome_unknown, %d other; slowest accepted submission %v",
		r.jobs, r.refused, r.lost, r.twice, r.succeeded, r.unknown, r.other, r.maxSubmit.Round(10*time.Millisecond))
}

func runClusterFault(b *testing.B, fault string) faultRun {
	const jobs, perSecond, rpm = 600, 10, 1200
	var setCut func(cut bool)
	var c *cluster
	var load *clusterLoad
	if fault == "partition" {
		proxies := map[[2]int]*routeProxy{}
		var mu sync.Mutex
		c, load, _ = clusterSetup(b, rpm, nil, func(from, to int, direct string) string {
			if from == to {
				return direct
			}
			mu.Lock()
			defer mu.Unlock()
			p := newRouteProxy(b, direct)
			proxies[[2]int{from, to}] = p
			return p.addr()
		}, "--nats-cluster-advertise", "127.0.0.1:1")
		setCut = func(cut bool) {
			for k, p := range proxies {
				if k[0] == 1 || k[1] == 1 {
					p.setCut(cut)
				}
			}
		}
	} else {
		c, load, _ = clusterSetup(b, rpm, nil, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	defer func() {
		// The next run starts from nothing.
		load.js.Conn().Close()
		for i := range c.nodes {
			c.kill(i)
		}
	}()

	start := time.Now()
	faultDone := make(chan struct{})
	go func() {
		defer close(faultDone)
		at := func(d time.Duration) { natstest.At(ctx, start.Add(d)) } // the fault's schedule
		switch fault {
		case "node-loss":
			at(20 * time.Second)
			c.kill(1)
			at(50 * time.Second)
			c.restart(1)
		case "partition":
			at(20 * time.Second)
			setCut(true)
			at(40 * time.Second)
			setCut(false)
		case "rolling-restart":
			at(15 * time.Second)
			for i := range c.nodes {
				n := c.nodes[i]
				n.mu.Lock()
				_ = n.proc.cmd.Process.Signal(syscall.SIGTERM)
				_ = n.proc.cmd.Wait()
				n.proc = nil
				n.mu.Unlock()
				c.restart(i)
			}
		}
	}()

	var (
		r       faultRun
		mu      sync.Mutex
		ids     []string
		refused atomic.Int64
		wg      sync.WaitGroup
	)
	hc := &http.Client{Timeout: time.Minute}
	tenants := []struct{ name, key string }{{"acme", "acme-key"}, {"globex", "globex-key"}, {"initech", "initech-key"}}
	owner := map[string]string{} // job id -> tenant
	for i := range jobs {
		natstest.Pace(ctx, start, i, time.Second/perSecond)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tn := tenants[i%3]
			body, _ := json.Marshal(map[string]any{"request": json.RawMessage(systest.ChatBody(load.model, 10+i%40, 40))})
			sent := time.Now()
			code, id, msg := submitAnyNode(ctx, hc, c, tn.key, body)
			if code != http.StatusAccepted {
				if n := refused.Add(1); n <= 5 {
					b.Logf("submission #%d refused at %v: %d %s", i, time.Since(start).Round(time.Millisecond), code, msg)
				}
				return
			}
			mu.Lock()
			ids = append(ids, id)
			owner[id] = tn.name
			r.maxSubmit = max(r.maxSubmit, time.Since(sent))
			mu.Unlock()
		}()
	}
	wg.Wait()
	<-faultDone
	r.jobs, r.refused = jobs, int(refused.Load())

	// Every accepted job's one result.
	resultsBy, stop := context.WithTimeout(ctx, 3*time.Minute)
	defer stop()
	unknown := map[string]bool{}
	for _, id := range ids {
		var res *job.Result
		if !natstest.Poll(resultsBy, func() bool {
			rctx, rcancel := context.WithTimeout(resultsBy, 5*time.Second)
			defer rcancel()
			var err error
			res, err = load.cl.Lookup(rctx, owner[id], id)
			return err == nil && res != nil
		}) {
			r.lost++
			b.Errorf("job %s has no result three minutes after the last submission", id)
			continue
		}
		switch {
		case res.Status == job.StatusSucceeded:
			r.succeeded++
		case res.Status == job.StatusFailed && res.Error != nil && res.Error.Code == "outcome_unknown":
			r.unknown++
			unknown[id] = true
		default:
			r.other++
			b.Errorf("job %s ended %s (%+v)", id, res.Status, res.Error)
		}
	}
	st := load.sim.Stats()
	r.twice = int(st.DuplicateCompletions)
	for _, id := range ids {
		if n := st.JobCompletions[id]; n > 1 || (n != 1 && !unknown[id]) {
			b.Errorf("job %s completed %d times at the provider (outcome unknown: %v)", id, n, unknown[id])
		}
	}
	if r.refused > 0 || r.lost > 0 || r.twice > 0 {
		b.Errorf("%s: %s", fault, r)
	}
	return r
}

// submitAnyNode posts a job to node 1, or to the next node that answers
// when a node does not answer at all (stopped, restarting): what a client
// behind a load balancer sees. It returns the HTTP status (0: no node
// answered), the job id and, when refused, the body.
func submitAnyNode(ctx context.Context, hc *http.Client, c *cluster, key string, body []byte) (code int, id, msg string) {
	// Each node in turn until one answers, for up to 6 s.
	tctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	try := 0
	natstest.Poll(tctx, func() bool {
		n := c.nodes[try%len(c.nodes)]
		try++
		n.mu.Lock()
		p := n.proc
		n.mu.Unlock()
		if p == nil {
			return false
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.HTTP+"/v1/jobs", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			msg = err.Error()
			return false
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if code = resp.StatusCode; code != http.StatusAccepted {
			msg = string(data)
			return true
		}
		var out struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(data, &out)
		id, msg = out.ID, ""
		return true
	})
	return code, id, msg
}
