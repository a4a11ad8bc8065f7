package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// The anthropic-cache scenario: agent-like jobs against the simulator's
// anthropic profile (RPM, ITPM and OTPM buckets, cache reads free): each
// job is a 3,000-token system prompt marked for caching plus a 200-token
// turn of its own, max_tokens 500, and the model is bound by its input
// tokens per minute. Sluice reserves a warm prefix net of the cache read,
// so it can send many times the requests that reserving every prompt in
// full would allow.

// AnthropicModel is the model the scenario runs.
const AnthropicModel = "claude-bench"

// AnthropicCacheSpec shapes the scenario.
type AnthropicCacheSpec struct {
	RPM, ITPM, OTPM int
	// SystemTokens and TurnTokens are the prompt's parts in characters/4
	// (the simulator's count before Count scales it); MaxTokens the output
	// limit asked.
	SystemTokens, TurnTokens, MaxTokens int
	// Jobs are submitted all at once.
	Jobs int
	// Count is the provider's count of a prompt over Sluice's estimate
	// of it (1.12: the provider counts 12 % more, as Anthropic's tokenizer
	// often does for English; 0.85: 15 % less). The simulator's count is
	// scaled to it (sim.TokenCount.Factor).
	Count float64
}

// DefaultAnthropicCache is the scenario as `sluice bench` runs it: about
// 100 requests a minute fit its ITPM once the prefix is cached, about 6
// without caching, so 330 jobs keep the model busy for over three minutes.
var DefaultAnthropicCache = AnthropicCacheSpec{RPM: 1000, ITPM: 20_000, OTPM: 80_000,
	SystemTokens: 3000, TurnTokens: 200, MaxTokens: 500, Jobs: 330, Count: 1.12}

// AnthropicCacheCounts are the provider's counts `sluice bench
// anthropic-cache` runs at: above Sluice's estimate, then below it.
var AnthropicCacheCounts = []float64{1.12, 0.85}

// AnthropicCacheTarget is what Sluice must achieve.
var AnthropicCacheTarget = struct {
	MinFill, Max429Pct, MinSpeedup float64
}{0.95, 0.5, 3}

// AnthropicCacheResult is what the simulator saw.
type AnthropicCacheResult struct {
	Spec AnthropicCacheSpec `json:"spec"`
	// Fill is the steady fill of ITPM (and OTPMFill of OTPM) as the
	// provider counts them: the mean over the trailing 60-s windows from
	// the 90th second to the last full minute of the backlog.
	Fill, OTPMFill float64
	// RPM is the requests admitted per minute over the same windows, and
	// FullPromptRPM what ITPM allows when every prompt is charged in full.
	RPM, FullPromptRPM float64
	Speedup            float64
	Attempts, Pct429   float64
	// CacheHit is cache_read / all input tokens of admitted requests.
	CacheHit                float64
	Succeeded, Failed, Lost int
	WallS                   float64
	Pass                    bool
	Why                     string
	// Timeline is the simulator's per second; Sluice what the fleet's
	// metrics said.
	Timeline []sim.MessagesSecond `json:"timeline"`
	Sluice   *SluiceMetrics       `json:"sluice,omitempty"`
}

// anthropicJobs are the scenario's bodies (OpenAI chat shape, the system
// prompt's part marked with cache_control, as Sluice's Anthropic client
// forwards it): the same system prompt, a distinct turn each.
func anthropicJobs(s AnthropicCacheSpec, seed uint64) []Job {
	rng := rand.New(rand.NewPCG(seed, 7))
	text := func(tokens int) string {
		// Characters/4 is the simulator's count (before Count scales it):
		// ordinary English words, which Sluice's tokenizer counts close
		// to that, so the provider's count is set by Count alone.
		var b strings.Builder
		for b.Len() < 4*tokens-3 {
			b.WriteByte(' ')
			b.WriteString(englishWords[rng.IntN(len(englishWords))])
		}
		return b.String()[:4*tokens-3]
	}
	system := text(s.SystemTokens)
	jobs := make([]Job, s.Jobs)
	for i := range jobs {
		body, _ := json.Marshal(map[string]any{
			"model": AnthropicModel, "max_tokens": s.MaxTokens,
			"messages": []map[string]any{
				{"role": "system", "content": []map[string]any{{"type": "text", "text": system, "cache_control": map[string]string{"type": "ephemeral"}}}},
				{"role": "user", "content": text(s.TurnTokens)},
			},
		})
		jobs[i] = Job{Body: body, MaxTokens: s.MaxTokens}
	}
	return jobs
}

// englishWords are common words the scenario's text is drawn from.
var englishWords = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his from at
which but have an they you were her she there one all we their has been would when who will more no if out so said
what up its about into than them can only other new some could time these two may then do first any my now such like
our over man me even most made after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might us great old year off come since against
go came right used take three plan file report change review step check result answer question system code test
build read write order account project team value number point group problem fact part place case week company`)

// RunAnthropicCache runs the scenario: the Sluice fleet (Fleet) told the
// real limits, against one simulator with the anthropic profile.
func RunAnthropicCache(ctx context.Context, s AnthropicCacheSpec, opt Options) (*AnthropicCacheResult, error) {
	opt = opt.withDefaults()
	began := time.Now()
	jobs := anthropicJobs(s, opt.Seed)
	factor, err := countFactor(jobs[0].Body, s)
	if err != nil {
		return nil, err
	}
	sm, err := sim.New(sim.Config{Profile: sim.ProfileAnthropic, TTFT: opt.TTFT, PerToken: opt.PerToken, Count: sim.TokenCount{Factor: factor},
		Models: []sim.ModelLimits{{Name: AnthropicModel, RPM: s.RPM, ITPM: s.ITPM, OTPM: s.OTPM}}})
	if err != nil {
		return nil, err
	}
	url, stop, err := serve(sm)
	if err != nil {
		return nil, err
	}
	defer stop()
	m := &mesh{spec: nodeSpec{kind: "anthropic", model: AnthropicModel, rpm: s.RPM, itpm: s.ITPM, otpm: s.OTPM,
		maxConcurrency: opt.Concurrency, retry: opt.Retry, maxElapsed: opt.RunTimeout, log: opt.Log, joiners: Fleet}}
	if err := m.prepare(ctx, url+"/v1"); err != nil {
		return nil, err
	}
	defer func() {
		if err := m.close(); err != nil {
			opt.Log.Warn("close sluice", "err", err)
		}
	}()
	sm.Reset()
	t0 := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, t0.Add(opt.RunTimeout))
	defer cancel()
	t := newTracker(len(jobs), t0, opt.OnJob)
	m.run(runCtx, jobs, t)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := sm.Messages()[AnthropicModel]
	_, failed, unfinished := t.summary()
	r := &AnthropicCacheResult{Spec: s, Failed: failed, Lost: failed, Succeeded: len(jobs) - failed - unfinished, WallS: time.Since(began).Seconds()}
	r.Attempts = float64(st.Admitted + st.RateLimited)
	if r.Attempts > 0 {
		r.Pct429 = 100 * float64(st.RateLimited) / r.Attempts
	}
	if in := st.InputCharged + st.CacheRead; in > 0 {
		r.CacheHit = float64(st.CacheRead) / float64(in)
	}
	r.Fill, r.OTPMFill, r.RPM = steadyMessages(st.Timeline, s)
	r.Timeline, r.Sluice = st.Timeline, m.metrics
	perRequest := float64(s.SystemTokens+s.TurnTokens+3) * factor // the simulator's count, 3 for the message
	r.FullPromptRPM = float64(s.ITPM) / perRequest
	if r.FullPromptRPM > 0 {
		r.Speedup = r.RPM / r.FullPromptRPM
	}
	tg := AnthropicCacheTarget
	var why []string
	if r.Fill < tg.MinFill && r.OTPMFill < tg.MinFill {
		why = append(why, fmt.Sprintf("fill %.3f < %.2f", max(r.Fill, r.OTPMFill), tg.MinFill))
	}
	if r.Pct429 > tg.Max429Pct {
		why = append(why, fmt.Sprintf("429s %.2f%% > %.1f%%", r.Pct429, tg.Max429Pct))
	}
	if r.Speedup < tg.MinSpeedup {
		why = append(why, fmt.Sprintf("speedup %.1fx < %.0fx", r.Speedup, tg.MinSpeedup))
	}
	if r.Lost > 0 || unfinished > 0 {
		why = append(why, fmt.Sprintf("%d failed, %d unfinished", failed, unfinished))
	}
	r.Pass, r.Why = len(why) == 0, strings.Join(why, "; ")
	return r, nil
}

// countFactor is the simulator's TokenCount.Factor that makes it count a
// job's prompt s.Count times Sluice's estimate of it: the text's
// characters/4 (and 3 for the turn's message) against package tokens.
func countFactor(body []byte, s AnthropicCacheSpec) (float64, error) {
	if s.Count <= 0 {
		return 1, nil
	}
	_, est, err := tokens.Estimate(job.EndpointChat, body, job.Limits{}, 0)
	if err != nil || est.PromptTokens <= 0 {
		return 0, fmt.Errorf("estimate the scenario's prompt: %v", err)
	}
	f := s.Count * float64(est.PromptTokens) / float64(s.SystemTokens+s.TurnTokens+3)
	if !(f > 0 && f <= 10) {
		return 0, fmt.Errorf("a provider count of %g times the estimate needs a simulator factor of %.2f, outside (0, 10]", s.Count, f)
	}
	return f, nil
}

// steadyMessages averages, over the trailing 60-s windows ending from the
// 90th second to the end of the backlog (the last second any request was
// admitted, less a minute), the ITPM and OTPM charged as fractions of the
// limits, and the requests admitted.
func steadyMessages(tl []sim.MessagesSecond, s AnthropicCacheSpec) (fill, otpmFill, rpm float64) {
	last := -1
	for i, sec := range tl {
		if sec.Admitted > 0 {
			last = i
		}
	}
	var n int
	var in, out, reqs int64
	for end := 90; end <= last; end++ {
		var wi, wo, wr int64
		for i := end - 59; i <= end; i++ {
			wi += tl[i].Input
			wo += tl[i].Output
			wr += tl[i].Admitted
		}
		in, out, reqs, n = in+wi, out+wo, reqs+wr, n+1
	}
	if n == 0 {
		return 0, 0, 0
	}
	if s.ITPM > 0 {
		fill = float64(in) / float64(n) / float64(s.ITPM)
	}
	if s.OTPM > 0 {
		otpmFill = float64(out) / float64(n) / float64(s.OTPM)
	}
	return fill, otpmFill, float64(reqs) / float64(n)
}

// WriteAnthropicCache prints the scenario's figures.
func WriteAnthropicCache(w io.Writer, r *AnthropicCacheResult) {
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL (" + r.Why + ")"
	}
	s := r.Spec
	fmt.Fprintf(w, "anthropic-cache: %d jobs of a %d-token cached system prompt + %d-token turn, max_tokens %d; RPM %d, ITPM %d, OTPM %d (anthropic profile); the provider counts %.2fx Sluice's estimate\n",
		s.Jobs, s.SystemTokens, s.TurnTokens, s.MaxTokens, s.RPM, s.ITPM, s.OTPM, s.Count)
	fmt.Fprintf(w, "  ITPM fill %.3f, OTPM fill %.3f (as the provider counts, steady), %.1f requests/min = %.1fx the %.1f full-prompt reservation allows\n",
		r.Fill, r.OTPMFill, r.RPM, r.Speedup, r.FullPromptRPM)
	fmt.Fprintf(w, "  %.0f attempts, %.2f%% 429s, cache hit %.3f of input tokens, %d succeeded, %d lost; %.1fs\n",
		r.Attempts, r.Pct429, r.CacheHit, r.Succeeded, r.Lost, r.WallS)
	fmt.Fprintf(w, "  target ≥%.2f fill, ≤%.1f%% 429s, ≥%.0fx: %s\n", AnthropicCacheTarget.MinFill, AnthropicCacheTarget.Max429Pct, AnthropicCacheTarget.MinSpeedup, verdict)
}
