package bench

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

func TestAfter60(t *testing.T) {
	t.Parallel()
	// 90 seconds: 10 arrivals a second, 1 of them refused in the first
	// minute and 3 after it; one more refusal in second 59 and none in 60.
	tl := make([]sim.Second, 90)
	for i := range tl {
		tl[i] = sim.Second{Admitted: 9, RateLimited: 1}
		if i >= 60 {
			tl[i] = sim.Second{Admitted: 7, RateLimited: 3}
		}
	}
	tl[59].RateLimited++
	tl[60] = sim.Second{Admitted: 10}
	attempts, limited := after60(tl)
	if attempts != 300 || limited != 87 {
		t.Errorf("after60 = %d attempts, %d 429s; want 300, 87", attempts, limited)
	}
	if got := percent(limited, attempts); got != 29 {
		t.Errorf("percent = %g, want 29", got)
	}
	if a, l := after60(tl[:60]); a != 0 || l != 0 {
		t.Errorf("a 60-s timeline has %d attempts, %d 429s after 60 s; want none", a, l)
	}

	// summarize fills the figures from a simulator's stats.
	w := &Workload{Spec: Spec{Name: "a", RPM: 600, TPM: 1_000_000}, Jobs: make([]Job, 3)}
	tr := newTracker(3, sim.Stats{}.StartedAt, nil)
	tr.finish(0, true)
	tr.finish(1, false)
	st := sim.Stats{Models: map[string]sim.ModelStats{Model: {Admitted: 900 - 87, RateLimited: 87, Timeline: tl,
		RateLimitedBy: map[string]int64{"requests_short_window": 87}}}}
	r := summarize(Sluice, w, Requests, st, tr, 0)
	if r.AttemptsAfter60 != 300 || r.Provider429sAfter60 != 87 || r.Pct429After60 != 29 {
		t.Errorf("summarize: after 60 s %d attempts, %d 429s, %g%%; want 300, 87, 29%%", r.AttemptsAfter60, r.Provider429sAfter60, r.Pct429After60)
	}
	if r.Pct429 != percent(87, 900) || r.Lost != 2 || r.Unfinished != 1 || r.RateLimitedBy["requests_short_window"] != 87 {
		t.Errorf("summarize: %g%% 429s, %d lost (%d unfinished), by %v", r.Pct429, r.Lost, r.Unfinished, r.RateLimitedBy)
	}
}

func TestTargetCheck(t *testing.T) {
	t.Parallel()
	known := Target{MinFill: 0.97, Max429Pct: 0.5, NoLoss: true}
	twice := Target{MinFill: 0.90, Max429Pct: 2, After60: true}
	discover := Target{MinFill: 0.90}
	for _, c := range []struct {
		name   string
		target Target
		r      Result
		misses []string
	}{
		{"known pass", known, Result{Goodput: 0.975, Pct429: 0.4}, nil},
		{"known all missed", known, Result{Goodput: 0.951, Pct429: 0.6, Lost: 3}, []string{"fill 95.1%", "429s 0.6%", "3 lost"}},
		{"after 60 s counts only the tail", twice, Result{Goodput: 0.93, Pct429: 9, AttemptsAfter60: 100, Pct429After60: 1.5}, nil},
		{"after 60 s missed", twice, Result{Goodput: 0.93, Pct429: 1, AttemptsAfter60: 100, Pct429After60: 2.5}, []string{"429s after 60s 2.5%"}},
		{"short run falls back to the whole run", twice, Result{Goodput: 0.93, Pct429: 3}, []string{"429s 3%"}},
		{"no 429 bound", discover, Result{Goodput: 0.90, Pct429: 40, Lost: 5}, nil},
	} {
		v := c.target.Check(c.r)
		if v.Pass != (len(c.misses) == 0) || !slices.Equal(v.Misses, c.misses) {
			t.Errorf("%s: verdict %+v, want misses %q", c.name, v, c.misses)
		}
	}
	for target, want := range map[Target]string{
		known:    "≥97% fill, ≤0.5% 429s, 0 lost",
		twice:    "≥90% fill, ≤2% 429s after 60s",
		discover: "≥90% fill",
	} {
		if got := target.String(); got != want {
			t.Errorf("target %+v reads %q, want %q", target, got, want)
		}
	}
	if got := (Verdict{Misses: []string{"fill 95.1%", "3 lost"}}).String(); got != "FAIL: fill 95.1%, 3 lost" {
		t.Errorf("verdict reads %q", got)
	}
}

func TestScenarios(t *testing.T) {
	t.Parallel()
	for _, sc := range Scenarios {
		if _, ok := LookupSpec(sc.Workload); !ok {
			t.Errorf("scenario %s runs unknown workload %q", sc.Name, sc.Workload)
		}
		if !slices.Contains(sim.Profiles(), sc.withDefaults().Profile) {
			t.Errorf("scenario %s: unknown profile %q", sc.Name, sc.Profile)
		}
		if sc.Target.MinFill <= 0 {
			t.Errorf("scenario %s has no fill target", sc.Name)
		}
	}
	w := &Workload{Spec: Spec{RPM: 600, TPM: 150_000}}
	for _, c := range []struct {
		name               string
		rpm, tpm           int
		discover, noHeader bool
	}{{"known", 600, 150_000, false, false}, {"twice", 1200, 300_000, false, false}, {"discover", 0, 0, true, false}, {"hidden", 1200, 300_000, false, true}} {
		sc, _ := LookupScenario(c.name)
		rpm, tpm, discover := sc.sluiceLimits(w)
		if rpm != c.rpm || tpm != c.tpm || discover != c.discover || sc.withDefaults().NoRateHeaders != c.noHeader {
			t.Errorf("%s: sluice told %d RPM / %d TPM (discover %v, no headers %v)", c.name, rpm, tpm, discover, sc.withDefaults().NoRateHeaders)
		}
	}

	all, err := ParseScenarios("all")
	if err != nil || len(all) != len(Scenarios) {
		t.Errorf("ParseScenarios(all) = %d scenarios, %v", len(all), err)
	}
	if none, err := ParseScenarios("none"); err != nil || len(none) != 0 {
		t.Errorf("ParseScenarios(none) = %v, %v", none, err)
	}
	got, err := ParseScenarios("hidden, known:b,hidden")
	if err != nil || len(got) != 2 || got[0].Name != "hidden" || got[0].Workload != "a" || got[1].Name != "known" || got[1].Workload != "b" {
		t.Errorf("ParseScenarios(hidden, known:b, hidden) = %+v, %v", got, err)
	}
	for _, bad := range []string{"nope", "known:z", "known,"} {
		if _, err := ParseScenarios(bad); err == nil {
			t.Errorf("ParseScenarios(%q) = nil error", bad)
		}
	}
}

func TestWriteTableScenarios(t *testing.T) {
	t.Parallel()
	known, _ := LookupScenario("known")
	hidden, _ := LookupScenario("hidden")
	run := func(sc *Scenario, fill float64) *WorkloadResult {
		w := &WorkloadResult{Setup: DefaultSetup.withDefaults(), Name: "a", RPM: 600, TPM: 1_000_000, Binding: Requests, Limit: 600, Jobs: 750,
			SluiceRPM: 600, SluiceTPM: 1_000_000}
		for _, s := range Strategies {
			w.Results = append(w.Results, Result{Strategy: s, Goodput: fill, Successes: 750, ProviderRequests: 760, Provider429s: 10,
				Pct429: percent(10, 760), AttemptsAfter60: 200, Provider429sAfter60: 1, Pct429After60: 0.5, AttemptsPerSuccess: 760.0 / 750})
		}
		if sc != nil {
			w.Scenario, w.Setup = sc.Name, sc.Setup.withDefaults()
			w.Target = &sc.Target
			r := &w.Results[len(w.Results)-1]
			r.Sluice = &SluiceMetrics{Cuts: map[string]float64{"burst": 2}, Effective: map[string]float64{"requests_per_minute": 600}}
			r.RateLimitedBy = map[string]int64{"requests_short_window": 10}
			v := sc.Target.Check(*r)
			r.Verdict = &v
		}
		return w
	}
	var out bytes.Buffer
	if err := WriteTable(&out, []*WorkloadResult{run(nil, 0.95), run(&known, 0.98), run(&hidden, 0.9)}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"known:a", "hidden:a",
		"≥97% fill, ≤0.5% 429s, 0 lost: FAIL: 429s 1.32%",
		"≥85% fill, ≤3% 429s: pass",
		"hidden profile, no rate headers, Sluice told 2x the real limits",
		"429s by sim limit requests_short_window=10; cuts burst=2",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	rows := 0
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "% of RPM") {
			rows++
			// Only Sluice's row of a scenario carries a target.
			if strings.Contains(line, "fill,") != (strings.Contains(line, " sluice ") && !strings.HasPrefix(strings.TrimSpace(line), "a ")) {
				t.Errorf("target on the wrong row: %q", line)
			}
		}
	}
	if rows != 12 {
		t.Errorf("table has %d rows, want 12:\n%s", rows, text)
	}
	// Each scenario's panel says its target and verdict.
	if p := PanelOf(run(&hidden, 0.9)); !strings.Contains(p.Title, "scenario hidden on workload a") || !strings.Contains(p.Subtitle, "≤3% 429s: pass") {
		t.Errorf("panel title %q, subtitle %q", p.Title, p.Subtitle)
	}
}

func TestSluiceMetricsGather(t *testing.T) {
	t.Parallel()
	newReg := func(cuts float64, eff float64) *prometheus.Registry {
		reg := prometheus.NewRegistry()
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricCuts}, []string{"provider", "model", "reason"})
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricEffective}, []string{"provider", "model", "dimension"})
		reg.MustRegister(c, g)
		c.WithLabelValues("sim", Model, "burst").Add(cuts)
		c.WithLabelValues("sim", "other-model", "burst").Add(100)
		if eff > 0 {
			g.WithLabelValues("sim", Model, "requests_per_minute").Set(eff)
		}
		return reg
	}
	regs := []*prometheus.Registry{newReg(1, 0), newReg(2, 450)}
	var m SluiceMetrics
	m.sample(regs, 5)
	m.finish(regs, 10)
	if m.Cuts["burst"] != 3 || m.Effective["requests_per_minute"] != 450 || len(m.Samples) != 2 || m.Samples[0].AtS != 5 {
		t.Errorf("gathered %+v", m)
	}
	// All: counters summed over the nodes, gauges the largest; other
	// models left out.
	if len(m.All) != 2 || m.All[metricCuts+`{reason="burst"}`] != 3 || m.All[metricEffective+`{dimension="requests_per_minute"}`] != 450 {
		t.Errorf("all series %v", m.All)
	}
}

// A scenario's token ratio makes its simulators count the workload's
// prompts that many times Sluice's estimate, over the workload.
func TestTokenRatio(t *testing.T) {
	t.Parallel()
	spec, _ := LookupSpec("b")
	w, err := Generate(spec, 1, 0.2, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, ratio := range []float64{1.15, 0.6} {
		c, err := Setup{TokenRatio: ratio}.tokenCount(w)
		if err != nil {
			t.Fatal(err)
		}
		var est, counted int
		for _, j := range w.Jobs {
			req, err := job.ParseRequest(j.Body, job.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			est += j.Prompt
			counted += c.Prompt(req)
		}
		if got := float64(counted) / float64(est); got < ratio-0.01 || got > ratio+0.01 {
			t.Errorf("token ratio %g: the simulator counts %.3f times the estimate", ratio, got)
		}
	}
}
