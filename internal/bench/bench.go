// Package bench compares ways of calling a rate-limited LLM provider on the
// same workload and the same limits: a "just retry" client, a request-rate
// limiter, a token-aware shaper, and Sluice itself. Every strategy gets its
// own provider simulator (package sim) with identical limits, and every
// figure reported comes from that simulator's own ledger, not from what the
// strategy believes it did. It also measures what the mesh adds to a call's
// latency (Overhead).
//
// `sluice bench` is the command that runs it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// DefaultRunTimeout bounds one strategy's run. The paced strategies and
// Sluice finish a 1.25-minute workload in about 80 s; the retry-only client
// on an RPM-bound workload needs well over two minutes (its 429s count
// against the RPM it is short of), so it is cut here, which keeps the three
// workloads and six scenarios of `sluice bench` under about 15 minutes.
const DefaultRunTimeout = 90 * time.Second

// Options configure Run.
type Options struct {
	// Concurrency is the worker count of the direct strategies and Sluice's
	// max_concurrency for the model.
	Concurrency int
	// Seed fixes the workload and the strategies' jitter.
	Seed uint64
	// RunTimeout bounds each strategy's run; jobs unfinished by then count
	// as failed.
	RunTimeout time.Duration
	// TTFT and PerToken shape the simulator's latency.
	TTFT, PerToken time.Duration
	// Retry is the retry policy of every strategy.
	Retry RetryPolicy
	// OnJob is called once per finished job, from any goroutine.
	OnJob func()
	// Log receives the embedded node's logs (nil: discarded).
	Log *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 32
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = DefaultRunTimeout
	}
	if o.Retry.MaxAttempts == 0 {
		o.Retry = DefaultRetry
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Result is everything one strategy did on one workload, as the provider
// simulator saw it (except latency and failures, which only the caller sees).
type Result struct {
	Strategy string  `json:"strategy"`
	ElapsedS float64 `json:"elapsed_s"`
	// Goodput is the binding limit's steady-state fill by successful calls
	// (sim.ModelStats.SteadyStateFill): the mean, over every trailing 60-s
	// window ending after the first minute, of what successful calls were
	// charged over the limit. ShortRun marks runs shorter than 61 s, where
	// it is successful charges / (limit × elapsed minutes) instead.
	Goodput  float64 `json:"goodput"`
	ShortRun bool    `json:"short_run,omitempty"`
	// Provider figures.
	ProviderRequests   int64   `json:"provider_requests"` // arrivals at the limiter
	Provider429s       int64   `json:"provider_429s"`
	Successes          int64   `json:"successes"`
	SuccessTokens      int64   `json:"success_tokens"` // prompt + completion, as reported
	AttemptsPerSuccess float64 `json:"attempts_per_success"`
	MaxRequestsIn60s   int     `json:"max_requests_in_60s"`
	MaxTokensIn60s     int     `json:"max_tokens_in_60s"`
	Duplicates         int64   `json:"duplicate_completions"`
	// Distinct is how many distinct requests the jobs held.
	Distinct int `json:"distinct_requests"`
	// Caller figures: latency from submission to result of successful jobs.
	P50MS      float64 `json:"p50_ms"`
	P95MS      float64 `json:"p95_ms"`
	Failed     int     `json:"failed"`
	Unfinished int     `json:"unfinished"`
	// Lost is every job that did not succeed: failed, unfinished included.
	Lost int `json:"lost"`
	// Pct429 is provider 429s as a percentage of attempts (arrivals at the
	// limiter); AttemptsAfter60, Provider429sAfter60 and Pct429After60 the
	// same over the timeline's seconds after the first 60.
	Pct429              float64 `json:"provider_429_pct"`
	AttemptsAfter60     int64   `json:"attempts_after_60s"`
	Provider429sAfter60 int64   `json:"provider_429s_after_60s"`
	Pct429After60       float64 `json:"provider_429_pct_after_60s"`
	// The same after the first 30 s.
	AttemptsAfter30 int64   `json:"attempts_after_30s"`
	Pct429After30   float64 `json:"provider_429_pct_after_30s"`
	// RateLimitedBy counts the 429s by the simulator limit that refused
	// them (sim.ModelStats.RateLimitedBy).
	RateLimitedBy map[string]int64 `json:"rate_limited_by,omitempty"`
	// Sluice is what the fleet's own metrics said (sluice lane only).
	Sluice *SluiceMetrics `json:"sluice_metrics,omitempty"`
	// Verdict is the sluice lane's against its scenario's target.
	Verdict *Verdict `json:"verdict,omitempty"`
	// Trailing60 is, per second of the run, what successful calls that
	// arrived in the trailing 60 s were charged, in the binding dimension's
	// unit (requests or tokens).
	Trailing60 []int64 `json:"trailing_60s"`
	// Timeline is the simulator's per-second ledger of the run.
	Timeline []sim.Second `json:"timeline,omitempty"`
}

// WorkloadResult is one workload and each strategy's result on it, under
// one Setup (in a scenario or not).
type WorkloadResult struct {
	// Scenario names the scenario run ("" for the workload comparison).
	Scenario            string `json:"scenario,omitempty"`
	ScenarioDescription string `json:"scenario_description,omitempty"`
	Setup
	// SluiceRPM and SluiceTPM are the limits Sluice was configured with;
	// SluiceDiscovers that they were 0 with adaptive: true.
	SluiceRPM       int      `json:"sluice_rpm"`
	SluiceTPM       int      `json:"sluice_tpm"`
	SluiceDiscovers bool     `json:"sluice_discovers,omitempty"`
	SluiceFleet     string   `json:"sluice_fleet"`
	Target          *Target  `json:"target,omitempty"`
	Name            string   `json:"name"`
	Description     string   `json:"description"`
	RPM             int      `json:"rpm"`
	TPM             int      `json:"tpm"`
	Binding         Dim      `json:"binding"`
	Limit           int      `json:"limit"`
	Jobs            int      `json:"jobs"`
	OfferedRequests int      `json:"offered_requests"`
	OfferedTokens   int      `json:"offered_tokens"`
	OfferedLoad     float64  `json:"offered_load"` // offered binding units / limit
	WallS           float64  `json:"wall_s"`
	Results         []Result `json:"results"`
}

// Label names a result in tables and charts: the workload ("a"), or the
// scenario and its workload ("known:a").
func (w *WorkloadResult) Label() string {
	if w.Scenario == "" {
		return w.Name
	}
	return w.Scenario + ":" + w.Name
}

// Run runs every strategy on w at once, each against its own simulator
// enforcing DefaultSetup, and returns what the simulators saw.
func Run(ctx context.Context, w *Workload, opt Options) (*WorkloadResult, error) {
	return RunSetup(ctx, w, DefaultSetup, opt)
}

// RunScenario runs sc on w (a workload generated from sc.Workload's spec,
// or another) and judges Sluice's result against sc.Target.
func RunScenario(ctx context.Context, sc Scenario, w *Workload, opt Options) (*WorkloadResult, error) {
	out, err := RunSetup(ctx, w, sc.Setup, opt)
	if err != nil {
		return nil, err
	}
	out.Scenario, out.ScenarioDescription = sc.Name, sc.Description
	target := sc.Target
	out.Target = &target
	for i := range out.Results {
		if out.Results[i].Strategy == Sluice {
			v := target.Check(out.Results[i])
			out.Results[i].Verdict = &v
		}
	}
	return out, nil
}

// RunSetup runs every strategy on w at once, each against its own
// simulator enforcing the limits as setup says, and returns what the
// simulators saw.
func RunSetup(ctx context.Context, w *Workload, setup Setup, opt Options) (*WorkloadResult, error) {
	opt = opt.withDefaults()
	setup = setup.withDefaults()
	began := time.Now()
	reqs, toks := w.Offered()
	bind := w.Binding()
	srpm, stpm, discover := setup.sluiceLimits(w)
	out := &WorkloadResult{Setup: setup, SluiceRPM: srpm, SluiceTPM: stpm, SluiceDiscovers: discover, SluiceFleet: FleetDescription(),
		Name: w.Name, Description: w.Description, RPM: w.RPM, TPM: w.TPM, Binding: bind,
		Limit: w.Limit(bind), Jobs: len(w.Jobs), OfferedRequests: reqs, OfferedTokens: toks}
	out.OfferedLoad = ratio(reqs, out.Limit)
	if bind == Tokens {
		out.OfferedLoad = ratio(toks, out.Limit)
	}
	count, err := setup.tokenCount(w)
	if err != nil {
		return nil, err
	}
	jobs, distinct, err := setup.jobs(w, opt.Seed)
	if err != nil {
		return nil, err
	}
	lanes, err := startLanes(ctx, w, setup, opt, count, out)
	defer closeLanes(lanes, opt.Log)
	if err != nil {
		return nil, err
	}
	results := runLanes(ctx, w, opt, lanes, jobs)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i := range results {
		results[i].Distinct = distinct
	}
	out.Results = results
	out.WallS = time.Since(began).Seconds()
	return out, nil
}

// jobs are the jobs the setup offers (w's, as a reasoning model's, with
// repeats) and how many of them are distinct.
func (setup Setup) jobs(w *Workload, seed uint64) ([]Job, int, error) {
	jobs := w.Jobs
	if setup.Reasoning {
		var err error
		if jobs, err = reasoningJobs(w.Jobs); err != nil {
			return nil, 0, err
		}
	}
	if setup.Repeats > 0 {
		return repeatJobs(jobs, setup.Repeats, seed)
	}
	return jobs, len(jobs), nil
}

// lane is one strategy against a simulator of its own.
type lane struct {
	name  string
	sim   *sim.Server
	stopS func()
	strat strategy
}

// startLanes starts a simulator for each strategy and prepares the
// strategy against it; the lanes started are returned even with an error,
// for closeLanes.
func startLanes(ctx context.Context, w *Workload, setup Setup, opt Options, count sim.TokenCount, out *WorkloadResult) ([]*lane, error) {
	var lanes []*lane
	for _, name := range Strategies {
		s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: Model, RPM: w.RPM, TPM: w.TPM, Reasoning: setup.Reasoning}},
			Profile: setup.Profile, NoRateHeaders: setup.NoRateHeaders, TTFT: opt.TTFT, PerToken: opt.PerToken, Count: count})
		if err != nil {
			return lanes, err
		}
		url, stop, err := serve(s)
		if err != nil {
			return lanes, err
		}
		l := &lane{name: name, sim: s, stopS: stop}
		lanes = append(lanes, l)
		if name == Sluice {
			l.strat = &mesh{spec: nodeSpec{rpm: out.SluiceRPM, tpm: out.SluiceTPM, discover: out.SluiceDiscovers, maxConcurrency: opt.Concurrency,
				retry: opt.Retry, maxElapsed: opt.RunTimeout, log: opt.Log, joiners: Fleet, cache: setup.Repeats > 0}}
		} else {
			d, err := newDirect(name, opt.Concurrency, opt.Seed, opt.Retry, w.RPM, w.TPM)
			if err != nil {
				return lanes, err
			}
			l.strat = d
		}
		if err := l.strat.prepare(ctx, url+"/v1"); err != nil {
			return lanes, fmt.Errorf("%s: %w", name, err)
		}
	}
	return lanes, nil
}

func closeLanes(lanes []*lane, log *slog.Logger) {
	for _, l := range lanes {
		if l.strat != nil {
			if err := l.strat.close(); err != nil {
				log.Warn("close strategy", "strategy", l.name, "err", err)
			}
		}
		l.stopS()
	}
}

// runLanes runs every lane's jobs, all starting together, each on a fresh
// ledger, and summarizes each.
func runLanes(ctx context.Context, w *Workload, opt Options, lanes []*lane, jobs []Job) []Result {
	bind := w.Binding()
	t0 := time.Now()
	results := make([]Result, len(lanes))
	var wg sync.WaitGroup
	for i, l := range lanes {
		l.sim.Reset()
		wg.Add(1)
		go func() {
			defer wg.Done()
			runCtx, cancel := context.WithDeadline(ctx, t0.Add(opt.RunTimeout))
			defer cancel()
			t := newTracker(len(w.Jobs), t0, opt.OnJob)
			l.strat.run(runCtx, jobs, t)
			st := l.sim.Stats() // at the run's end: the timeline stops here
			results[i] = summarize(l.name, w, bind, st, t, time.Since(t0))
			if m, ok := l.strat.(*mesh); ok {
				results[i].Sluice = m.metrics
			}
		}()
	}
	wg.Wait()
	return results
}

// summarize turns one lane's simulator stats and tracker into a Result.
func summarize(name string, w *Workload, bind Dim, st sim.Stats, t *tracker, elapsed time.Duration) Result {
	ms := st.Models[Model]
	r := Result{Strategy: name, ElapsedS: elapsed.Seconds(),
		ProviderRequests: ms.Admitted + ms.RateLimited, Provider429s: ms.RateLimited,
		Successes: ms.SuccessRequests, SuccessTokens: ms.SuccessTokens,
		MaxRequestsIn60s: ms.MaxRequestsIn60s, MaxTokensIn60s: ms.MaxTokensIn60s,
		Duplicates: st.DuplicateCompletions}
	if ms.SuccessRequests > 0 {
		r.AttemptsPerSuccess = float64(r.ProviderRequests) / float64(ms.SuccessRequests)
	}
	limit := w.Limit(bind)
	rpmFill, tpmFill := ms.SteadyStateFill()
	if len(ms.FillSeries()) > 0 {
		r.Goodput = rpmFill
		if bind == Tokens {
			r.Goodput = tpmFill
		}
	} else {
		r.ShortRun = true
		var total int64
		for _, s := range ms.Timeline {
			total += unit(s, bind)
		}
		if m := elapsed.Minutes(); m > 0 && limit > 0 {
			r.Goodput = float64(total) / (float64(limit) * m)
		}
	}
	r.Trailing60 = trailing60(ms.Timeline, bind)
	r.Timeline = ms.Timeline
	r.RateLimitedBy = ms.RateLimitedBy
	r.Pct429 = percent(r.Provider429s, r.ProviderRequests)
	r.AttemptsAfter60, r.Provider429sAfter60 = after60(ms.Timeline)
	r.Pct429After60 = percent(r.Provider429sAfter60, r.AttemptsAfter60)
	var limited30 int64
	r.AttemptsAfter30, limited30 = after(ms.Timeline, 30)
	r.Pct429After30 = percent(limited30, r.AttemptsAfter30)
	lat, failed, unfinished := t.summary()
	r.Failed, r.Unfinished, r.Lost = failed, unfinished, failed
	r.P50MS = ms64(percentile(lat, 0.50))
	r.P95MS = ms64(percentile(lat, 0.95))
	return r
}

// unit is a timeline second's successful charge in dimension d.
func unit(s sim.Second, d Dim) int64 {
	if d == Requests {
		return s.Successes
	}
	return s.SuccessTokens
}

// trailing60 returns, per timeline second, the successful charge in d of the
// arrivals in the 60 s ending with it.
func trailing60(tl []sim.Second, d Dim) []int64 {
	out := make([]int64, len(tl))
	var sum int64
	for i, s := range tl {
		sum += unit(s, d)
		if i >= 60 {
			sum -= unit(tl[i-60], d)
		}
		out[i] = sum
	}
	return out
}

// percentile returns the nearest-rank p-quantile of d (0 when empty).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	k := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// serve serves h on a free loopback port until stop is called.
func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return
		}
	}()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		<-done
	}, nil
}
