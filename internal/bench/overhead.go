package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// OverheadOptions configure Overhead.
type OverheadOptions struct {
	Jobs        int // jobs in the loaded test
	Concurrency int // concurrent submitters in the loaded test
	Serial      int // jobs in the one-at-a-time test
	Warmup      int // serial jobs run first and not counted
	// Closed makes each submitter await its job's result before submitting
	// the next; by default submitters only submit (an open burst).
	Closed bool
	// Secure runs NATS with authentication and TLS, the submitters
	// connected as the tenant's user; otherwise with neither.
	Secure bool
	// JetStreamOps is how many operations of each kind measure
	// JetStream's own rates (before and after Sluice's run, on a server of
	// its own); 0 means 2,000, negative skips the measurement.
	JetStreamOps int
	Timeout      time.Duration
	Log          *slog.Logger
	// FloorJobs is how many jobs each floor pipeline (MeasureFloor) runs,
	// after Sluice's loaded test; 0 means Jobs, negative skips them. Not
	// with Cluster or Secure (the floor runs on one plain node).
	FloorJobs int
	// Cluster > 1 runs a JetStream cluster of that many in-process nodes
	// on loopback (streams and buckets replicated as many times), each
	// with every service; not with Secure.
	Cluster int
	// Trace runs the node with tracing on: every trace sampled, exported
	// over OTLP/HTTP to a receiver on loopback: SinkCommand (a command
	// that runs ServeSpanSink, as `sluice bench trace-sink` does) in a
	// process of its own, so that the receiver's CPU is not counted as
	// Sluice's; nil: in this process.
	Trace       bool
	SinkCommand []string
	// PromptBytes > 0 pads each job's message to about this many bytes
	// (what a large prompt costs the mesh); the floor, whose payloads are
	// the default body's sizes, is then not run.
	PromptBytes int
}

func (o OverheadOptions) withDefaults() OverheadOptions {
	if o.Jobs <= 0 {
		o.Jobs = 5000
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.Serial < 0 {
		o.Serial = 0
	}
	if o.Warmup < 0 {
		o.Warmup = 0
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.JetStreamOps == 0 {
		o.JetStreamOps = 2000
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.FloorJobs == 0 {
		o.FloorJobs = o.Jobs
	}
	if o.PromptBytes > 0 {
		o.FloorJobs = -1
	}
	if o.Cluster > 1 || o.Secure {
		o.FloorJobs = -1
	}
	return o
}

// Quantiles of a latency distribution, in milliseconds.
type Quantiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func quantiles(d []time.Duration) Quantiles {
	q := Quantiles{N: len(d), P50: ms64(percentile(d, 0.5)), P90: ms64(percentile(d, 0.9)), P99: ms64(percentile(d, 0.99))}
	for _, v := range d {
		q.Max = max(q.Max, ms64(v))
	}
	return q
}

// OverheadReport is what Overhead measured.
type OverheadReport struct {
	Jobs        int  `json:"jobs"`
	Concurrency int  `json:"concurrency"`
	Closed      bool `json:"closed_loop"`
	Secure      bool `json:"nats_auth_tls"`
	Completed   int  `json:"completed"`
	Failed      int  `json:"failed"`
	// Added is the loaded test's latency from just before client.Submit to
	// the provider receiving the call; EndToEnd to the result's arrival.
	Added    Quantiles `json:"added"`
	EndToEnd Quantiles `json:"end_to_end"`
	// WallS runs from the first submission to the last result.
	WallS      float64 `json:"wall_s"`
	JobsPerSec float64 `json:"jobs_per_s"`
	// CPUPerJobMS is the process's CPU time (user + system: the node,
	// NATS, the simulator and the submitters) during the loaded test per
	// completed job; 0 where not measured.
	CPUPerJobMS float64 `json:"cpu_per_job_ms"`
	// Traced: the node ran with tracing on (OverheadOptions.Trace);
	// SpansPerJob is the spans the receiver got, per job submitted in the
	// whole run (serial, warm-up and loaded), once the node flushed.
	Traced      bool    `json:"traced"`
	SpansPerJob float64 `json:"spans_per_job,omitempty"`
	SinkProcess bool    `json:"sink_process,omitempty"` // the receiver ran in a process of its own
	// Serial is the one-job-at-a-time test's added latency (unloaded),
	// SerialEndToEnd its submission-to-result latency.
	Serial         Quantiles `json:"serial_added"`
	SerialEndToEnd Quantiles `json:"serial_end_to_end"`
	// JetStream is JetStream's own rates (the mean of JetStreamBefore and
	// JetStreamAfter, measured just before and just after Sluice's run);
	// CeilingJobsPerS the naive pipeline's throughput at those rates
	// (JetStreamRates.Ceiling) and CeilingRatio JobsPerSec over it. Zero
	// when not measured.
	JetStream       JetStreamRates `json:"jetstream"`
	JetStreamBefore JetStreamRates `json:"jetstream_before"`
	JetStreamAfter  JetStreamRates `json:"jetstream_after"`
	CeilingJobsPerS float64        `json:"ceiling_jobs_per_s"`
	CeilingRatio    float64        `json:"ceiling_ratio"`
	// Floors are the floor pipelines' runs (MeasureFloor): Sluice's
	// JetStream operations with two records, without and with the provider
	// call, and with one record and the call. FloorRatio is JobsPerSec over
	// the first with the call (Sluice's own operations and call, nothing
	// else). Empty when not measured.
	Floors     []Floor `json:"floors,omitempty"`
	FloorRatio float64 `json:"floor_ratio,omitempty"`
}

// arrival is a result's arrival at the caller.
type arrival struct {
	ok bool
	at time.Time
}

// arrivals records when the provider first received each job's call, by the
// X-Sluice-Job-Id header the executor sends.
type arrivals struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (a *arrivals) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("X-Sluice-Job-Id"); id != "" {
			now := time.Now()
			a.mu.Lock()
			if _, seen := a.at[id]; !seen {
				a.at[id] = now
			}
			a.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func (a *arrivals) get(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

// overheadBody is the request every overhead job sends: small, so the
// measurement is the mesh, not the tokenizer.
var overheadBody = []byte(`{"model":"` + Model + `","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`)

// promptBody is overheadBody with its message padded to about n bytes of
// words (OverheadOptions.PromptBytes); n <= 0: overheadBody.
func promptBody(n int) []byte {
	if n <= 0 {
		return overheadBody
	}
	return []byte(`{"model":"` + Model + `","max_tokens":16,"messages":[{"role":"user","content":"` + strings.Repeat("Say hello. ", n/11) + `"}]}`)
}

// Overhead measures what the mesh adds between accepting a job and the
// provider receiving it, on one in-process node against a zero-latency
// simulator with no limits, and how many jobs per second it completes.
// progress, if not nil, is called once per result (Warmup + Serial + Jobs
// in all). Its phases: JetStream's rates, a node against the simulator,
// serial jobs, loaded jobs, the floors, JetStream's rates again.
func Overhead(ctx context.Context, opt OverheadOptions, progress func()) (*OverheadReport, error) {
	opt = opt.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, opt.Timeout)
	defer cancel()
	rep := &OverheadReport{Jobs: opt.Jobs, Concurrency: opt.Concurrency, Closed: opt.Closed, Secure: opt.Secure}
	if opt.JetStreamOps > 0 {
		r, err := MeasureJetStream(ctx, opt.JetStreamOps)
		if err != nil {
			return nil, fmt.Errorf("jetstream rates: %w", err)
		}
		rep.JetStreamBefore = r
	}
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: Model}}})
	if err != nil {
		return nil, err
	}
	arr := &arrivals{at: map[string]time.Time{}}
	url, stopSim, err := serve(arr.wrap(s))
	if err != nil {
		return nil, err
	}
	defer stopSim()
	spec := nodeSpec{providerURL: url + "/v1", maxConcurrency: max(opt.Concurrency, 64) * 4,
		retry: DefaultRetry, maxElapsed: time.Minute, log: opt.Log, nats: map[bool]natsMode{false: natsOpen, true: natsSecure}[opt.Secure], cluster: opt.Cluster}
	sink, err := startSink(opt, rep)
	if err != nil {
		return nil, err
	}
	defer sink.stop()
	if opt.Trace {
		spec.env = traceEnv(sink.url)
	}
	n, err := startNode(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer func() { _ = n.stop() }()
	sub := &submitter{n: n, arr: arr, results: map[string]chan arrival{}, progress: progress, body: promptBody(opt.PromptBytes)}
	subscription, err := n.cl.Subscribe(tenant, sub.arrived)
	if err != nil {
		return nil, err
	}
	defer func() { _ = subscription.Unsubscribe() }()

	if err := sub.serial(ctx, opt, rep); err != nil {
		return nil, err
	}
	if err := sub.loaded(ctx, opt, rep); err != nil {
		return rep, fmt.Errorf("overhead (timeout %s): %w", opt.Timeout, err)
	}
	if opt.Trace {
		// The node exports what it still buffers as it stops.
		if err := n.stop(); err != nil {
			return rep, err
		}
		spans, err := sink.count()
		if err != nil {
			return rep, err
		}
		rep.SpansPerJob = float64(spans) / float64(opt.Warmup+opt.Serial+opt.Jobs)
	}
	if opt.FloorJobs > 0 {
		if err := measureFloors(ctx, opt, url, rep); err != nil {
			return rep, err
		}
	}
	if opt.JetStreamOps > 0 {
		r, err := MeasureJetStream(ctx, opt.JetStreamOps)
		if err != nil {
			return rep, fmt.Errorf("jetstream rates: %w", err)
		}
		rep.JetStreamAfter = r
		rep.JetStream = meanRates(rep.JetStreamBefore, rep.JetStreamAfter)
		if rep.CeilingJobsPerS = rep.JetStream.Ceiling(); rep.CeilingJobsPerS > 0 {
			rep.CeilingRatio = rep.JobsPerSec / rep.CeilingJobsPerS
		}
	}
	return rep, nil
}

// submitter hands jobs to the node under test and hands each result to
// the channel of the job it is for.
type submitter struct {
	n        *meshNode
	arr      *arrivals
	progress func()
	body     []byte // each job's request

	mu      sync.Mutex
	results map[string]chan arrival
}

// arrived takes a result from the tenant's subscription.
func (s *submitter) arrived(r *job.Result) {
	now := time.Now()
	s.mu.Lock()
	ch := s.results[r.JobID]
	s.mu.Unlock()
	if ch != nil {
		select {
		case ch <- arrival{ok: r.Status == job.StatusSucceeded, at: now}:
			if s.progress != nil {
				s.progress()
			}
		default:
		}
	}
}

// submit hands one job over and returns its id, submit time and the
// channel its result will arrive on.
func (s *submitter) submit(ctx context.Context) (string, time.Time, chan arrival, error) {
	id := job.NewID()
	ch := make(chan arrival, 1)
	s.mu.Lock()
	s.results[id] = ch
	s.mu.Unlock()
	sent := time.Now()
	err := s.n.submit(ctx, &job.Job{ID: id, Tenant: tenant, Priority: job.Interactive, Request: s.body})
	return id, sent, ch, err
}

func await(ctx context.Context, ch chan arrival) (arrival, error) {
	select {
	case a := <-ch:
		return a, nil
	case <-ctx.Done():
		return arrival{}, ctx.Err()
	}
}

// serial measures unloaded: one job at a time (after a warm-up).
func (s *submitter) serial(ctx context.Context, opt OverheadOptions, rep *OverheadReport) error {
	var added, e2e []time.Duration
	for k := range opt.Warmup + opt.Serial {
		id, sent, ch, err := s.submit(ctx)
		if err != nil {
			return fmt.Errorf("serial job %d: %w", k, err)
		}
		a, err := await(ctx, ch)
		if err != nil {
			return fmt.Errorf("serial job %d: %w", k, err)
		}
		if !a.ok || k < opt.Warmup {
			continue
		}
		if at, seen := s.arr.get(id); seen {
			added = append(added, at.Sub(sent))
		}
		e2e = append(e2e, a.at.Sub(sent))
	}
	rep.Serial, rep.SerialEndToEnd = quantiles(added), quantiles(e2e)
	return nil
}

// sample is one loaded job.
type sample struct {
	id   string
	sent time.Time
	ch   chan arrival
	res  arrival
	err  error
}

// loaded measures under load: Concurrency submitters hand over Jobs jobs.
// Open (default): they submit as fast as Submit returns and the results
// are awaited afterwards; closed: each submitter awaits its job's result
// before submitting the next. The report is filled even when a job
// failed; the error is the first job's.
func (s *submitter) loaded(ctx context.Context, opt OverheadOptions, rep *OverheadReport) error {
	samples := make([]sample, opt.Jobs)
	cpu0 := processCPU()
	next := make(chan int)
	var wg sync.WaitGroup
	for range opt.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				sm := &samples[i]
				sm.id, sm.sent, sm.ch, sm.err = s.submit(ctx)
				if sm.err == nil && opt.Closed {
					sm.res, sm.err = await(ctx, sm.ch)
				}
			}
		}()
	}
feed:
	for i := range opt.Jobs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	var firstErr error
	for i := range samples {
		sm := &samples[i]
		if sm.err == nil && sm.ch != nil && !opt.Closed {
			sm.res, sm.err = await(ctx, sm.ch)
		}
		if sm.ch == nil {
			sm.err = ctx.Err()
		}
		if sm.err != nil && firstErr == nil {
			firstErr = sm.err
		}
	}
	s.report(rep, samples, processCPU()-cpu0)
	return firstErr
}

// report fills rep's loaded figures from the samples and the process's
// CPU time they took.
func (s *submitter) report(rep *OverheadReport, samples []sample, cpu time.Duration) {
	var added, e2e []time.Duration
	var first, last time.Time
	for _, sm := range samples {
		if !sm.sent.IsZero() && (first.IsZero() || sm.sent.Before(first)) {
			first = sm.sent
		}
		if !sm.res.ok {
			rep.Failed++
			continue
		}
		rep.Completed++
		if sm.res.at.After(last) {
			last = sm.res.at
		}
		if at, seen := s.arr.get(sm.id); seen {
			added = append(added, at.Sub(sm.sent))
		}
		e2e = append(e2e, sm.res.at.Sub(sm.sent))
	}
	rep.Added, rep.EndToEnd = quantiles(added), quantiles(e2e)
	if rep.Completed > 0 && cpu > 0 {
		rep.CPUPerJobMS = ms64(cpu) / float64(rep.Completed)
	}
	if wall := last.Sub(first); wall > 0 {
		rep.WallS = wall.Seconds()
		rep.JobsPerSec = float64(rep.Completed) / wall.Seconds()
	}
}

// measureFloors measures the floors against the same simulator (url):
// without a call, with one, with one and a single record.
func measureFloors(ctx context.Context, opt OverheadOptions, url string, rep *OverheadReport) error {
	for _, v := range []struct {
		url       string
		oneRecord bool
	}{{"", false}, {url + "/v1", false}, {url + "/v1", true}} {
		f, err := MeasureFloor(ctx, opt.FloorJobs, opt.Concurrency, v.url, v.oneRecord)
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		rep.Floors = append(rep.Floors, f)
		if f.Call && !f.OneRecord && f.JobsPerSec > 0 {
			rep.FloorRatio = rep.JobsPerSec / f.JobsPerSec
		}
	}
	return nil
}

// WriteOverhead prints an OverheadReport.
func WriteOverhead(out io.Writer, r *OverheadReport) {
	fmt.Fprintf(out, "serial (one job at a time, %d jobs): added latency p50 %.2fms  p99 %.2fms  (submit → result p50 %.2fms  p99 %.2fms)\n",
		r.Serial.N, r.Serial.P50, r.Serial.P99, r.SerialEndToEnd.P50, r.SerialEndToEnd.P99)
	mode := "open: submitters do not wait for results"
	if r.Closed {
		mode = "closed: each submitter awaits its result"
	}
	nats := "NATS without authentication or TLS"
	if r.Secure {
		nats = "NATS with authentication (nkeys, tenant user) and TLS"
	}
	fmt.Fprintf(out, "loaded (%d jobs, %d concurrent submitters, %s; %s):\n", r.Jobs, r.Concurrency, mode, nats)
	fmt.Fprintf(out, "                     added latency p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n",
		r.Added.P50, r.Added.P90, r.Added.P99, r.Added.Max)
	fmt.Fprintf(out, "                     submit → result p50 %.2fms  p90 %.2fms  p99 %.2fms\n", r.EndToEnd.P50, r.EndToEnd.P90, r.EndToEnd.P99)
	fmt.Fprintf(out, "throughput: %d jobs completed (%d failed) in %.2fs from first submit to last result = %.0f jobs/s\n",
		r.Completed, r.Failed, r.WallS, r.JobsPerSec)
	if r.CPUPerJobMS > 0 {
		fmt.Fprintf(out, "cpu: %.3f ms of process CPU (user + system) per job in the loaded test\n", r.CPUPerJobMS)
	}
	if r.Traced {
		where := map[bool]string{false: "in process", true: "in a process of its own"}[r.SinkProcess]
		fmt.Fprintf(out, "tracing: on (always_on, OTLP/HTTP to a receiver %s); %.2f spans received per job\n", where, r.SpansPerJob)
	}
	if r.CeilingJobsPerS > 0 {
		js, b, a := r.JetStream, r.JetStreamBefore, r.JetStreamAfter
		fmt.Fprintf(out, "jetstream alone (same embedded server config, file store, one loopback connection, one op at a time; mean of before / after):\n")
		fmt.Fprintf(out, "                     sync publish %.0f/s (%.0f / %.0f)  async publish %.0f/s  pull + double ack %.0f/s (%.0f / %.0f)  kv put %.0f/s\n",
			js.SyncPublishPerS, b.SyncPublishPerS, a.SyncPublishPerS, js.AsyncPublishPerS, js.PullAckPerS, b.PullAckPerS, a.PullAckPerS, js.KVPutPerS)
		fmt.Fprintf(out, "naive pipeline ceiling = 1 / (2/sync_publish + 1/pull_ack) = %.0f jobs/s (%.2f ms per job serially)\n",
			r.CeilingJobsPerS, 1000/r.CeilingJobsPerS)
	}
	if len(r.Floors) > 0 {
		fmt.Fprintf(out, "floor (Sluice's JetStream operations per job and nothing else: its streams, consumers and buckets, opaque payloads of its sizes; %d jobs, %d submitters):\n", r.Floors[0].Jobs, r.Concurrency)
		for _, f := range r.Floors {
			what := "two records (as Sluice), no provider call"
			switch {
			case f.Call && f.OneRecord:
				what = "one record per job,       provider call   "
			case f.Call:
				what = "two records (as Sluice), provider call   "
			}
			ceil := ""
			if r.CeilingJobsPerS > 0 {
				ceil = fmt.Sprintf(", %.2f of the ceiling", f.JobsPerSec/r.CeilingJobsPerS)
			}
			fmt.Fprintf(out, "                     %s %5.0f jobs/s  cpu %.3f ms per job%s\n", what, f.JobsPerSec, f.CPUPerJobMS, ceil)
		}
	}
	if r.CeilingJobsPerS > 0 {
		fmt.Fprintf(out, "sluice / ceiling: %.2f\n", r.CeilingRatio)
	}
	if r.FloorRatio > 0 {
		fmt.Fprintf(out, "sluice / floor with the provider call: %.2f\n", r.FloorRatio)
	}
}
