package sim

import (
	"maps"
	"time"
)

// Stats is a snapshot of what the simulator has seen since it started or was
// last Reset.
type Stats struct {
	// Profile is how the limits were enforced (Config.Profile).
	Profile string `json:"profile"`
	// Requests counts responses by HTTP status, all routes and models.
	// Connection resets and hangs write no status and are counted apart.
	Requests map[int]int64         `json:"requests"`
	Models   map[string]ModelStats `json:"models"`
	// Completed counts the work the provider finished: admitted requests that
	// were not faulted, whether or not their client was still there.
	// Replays are not completions.
	Completed int64 `json:"completed"`
	// Replayed counts responses served from the idempotency ledger.
	Replayed int64 `json:"replayed"`
	// DuplicateCompletions counts completions beyond the first for the same
	// Idempotency-Key or the same X-Sluice-Job-Id (one per completion, even
	// if it repeats both).
	DuplicateCompletions int64 `json:"duplicate_completions"`
	// ClientGone counts completions whose client left before the response.
	ClientGone int64 `json:"client_gone"`
	// ConnResets and Hangs count the connection faults injected.
	ConnResets int64 `json:"conn_resets"`
	Hangs      int64 `json:"hangs"`
	// StreamCuts and StreamStalls count the stream faults injected.
	StreamCuts   int64 `json:"stream_cuts"`
	StreamStalls int64 `json:"stream_stalls"`
	// Streamed counts streamed answers started (200 and an event stream).
	Streamed int64 `json:"streamed"`
	// IdempotencyCompletions and JobCompletions count completions per
	// Idempotency-Key and per X-Sluice-Job-Id header value.
	IdempotencyCompletions map[string]int64 `json:"idempotency_completions,omitempty"`
	JobCompletions         map[string]int64 `json:"job_completions,omitempty"`
	StartedAt              time.Time        `json:"started_at"`
	Now                    time.Time        `json:"now"`
}

// ModelStats is one model's share of Stats. Window maxima are exact: they are
// the largest sums any trailing window (t-60s, t] or (t-1s, t] held, over all
// t, of what was charged at arrival.
type ModelStats struct {
	// Requests counts this model's responses by HTTP status.
	Requests map[int]int64 `json:"requests"`
	// RPM and TPM are the configured limits; BurstRequests and BurstTokens
	// the per-second caps derived from them (0 = unlimited; always 0 under
	// azure and token-bucket, which have no 1-s window).
	RPM           int `json:"rpm"`
	TPM           int `json:"tpm"`
	BurstRequests int `json:"burst_requests"`
	BurstTokens   int `json:"burst_tokens"`
	// ShortWindowSeconds, ShortRequests and ShortTokens are the profile's
	// limit under the minute (0 = unlimited). For quantized, acceleration
	// and hidden: 1 s and the burst caps; for azure: 10 s and
	// max(ceil(limit/6), 1). For token-bucket: the seconds of refill a
	// bucket holds and its capacities, which may be fractional; a trailing
	// second then holds at most a capacity plus limit/60.
	ShortWindowSeconds float64 `json:"short_window_seconds"`
	ShortRequests      float64 `json:"short_requests"`
	ShortTokens        float64 `json:"short_tokens"`
	// AccelFloorRequests, AccelFloorTokens and AccelGrowth are the ramp of
	// acceleration: a trailing 10 s may hold the floor, or AccelGrowth
	// times what the 10 s before it held if more (requests counted when
	// admitted). 0 under the other profiles.
	AccelFloorRequests int     `json:"accel_floor_requests,omitempty"`
	AccelFloorTokens   int     `json:"accel_floor_tokens,omitempty"`
	AccelGrowth        float64 `json:"accel_growth,omitempty"`
	// MaxRequestsIn60s counts every arrival that reached the limiter,
	// rejected ones included, as the provider's RPM does;
	// MaxAdmittedRequestsIn60s only the admitted ones. Tokens are charged
	// only by admitted requests.
	MaxRequestsIn60s         int `json:"max_requests_in_60s"`
	MaxAdmittedRequestsIn60s int `json:"max_admitted_requests_in_60s"`
	MaxTokensIn60s           int `json:"max_tokens_in_60s"`
	MaxRequestsIn1s          int `json:"max_requests_in_1s"`
	MaxAdmittedRequestsIn1s  int `json:"max_admitted_requests_in_1s"`
	MaxTokensIn1s            int `json:"max_tokens_in_1s"`
	// MaxRequestsInShort, MaxAdmittedRequestsInShort and MaxTokensInShort
	// are the same maxima over the short window when it is not 1 s
	// (azure's 10 s); 0 otherwise.
	MaxRequestsInShort         int `json:"max_requests_in_short,omitempty"`
	MaxAdmittedRequestsInShort int `json:"max_admitted_requests_in_short,omitempty"`
	MaxTokensInShort           int `json:"max_tokens_in_short,omitempty"`
	// Admitted and RateLimited count arrivals by the limiter's decision;
	// ChargedTokens is what the admitted ones were charged (prompt + max).
	Admitted      int64 `json:"admitted"`
	RateLimited   int64 `json:"rate_limited"`
	ChargedTokens int64 `json:"charged_tokens"`
	// RateLimitedBy counts the rate-limited arrivals by the limit that
	// kept each out longest: "requests_per_minute", "tokens_per_minute",
	// "requests_short_window", "tokens_short_window", "requests_bucket",
	// "tokens_bucket", "requests_acceleration", "tokens_acceleration",
	// "too_large" (more tokens than TPM), or a per-day quota's
	// "requests_per_day" and "tokens_per_day".
	RateLimitedBy map[string]int64 `json:"rate_limited_by,omitempty"`
	// SuccessRequests counts completions; SuccessTokens their prompt +
	// completion tokens as reported in usage.
	SuccessRequests int64 `json:"success_requests"`
	SuccessTokens   int64 `json:"success_tokens"`
	// Timeline has one entry per second that has fully elapsed since
	// StartedAt: Timeline[i] covers [StartedAt+i s, StartedAt+(i+1) s).
	Timeline []Second `json:"timeline,omitempty"`
	// Units are the model's units other than requests and tokens, by
	// name (ModelLimits.Units).
	Units map[string]UnitStats `json:"units,omitempty"`
}

// Second is what happened to one model's arrivals in one second. Successes
// are filed under their arrival second, when they were charged.
type Second struct {
	Admitted      int64 `json:"admitted"`
	ChargedTokens int64 `json:"charged_tokens"`
	RateLimited   int64 `json:"rate_limited"`
	Successes     int64 `json:"successes"`
	// SuccessTokens is what the successful arrivals were charged (prompt +
	// max output), the basis the provider's TPM counts.
	SuccessTokens int64 `json:"success_tokens"`
}

// Fill is the goodput of the trailing 60 seconds ending with one timeline
// second: successful arrivals' charges over the limits (0 when unlimited).
type Fill struct {
	End  int     `json:"end"` // index of the window's last second
	RPM  float64 `json:"rpm"`
	TPM  float64 `json:"tpm"`
	Reqs int64   `json:"requests"`
	Toks int64   `json:"tokens"`
}

// FillSeries returns the Fill of every full 60-second window ending at a
// timeline second >= 60 (the first minute is warm-up).
func (m ModelStats) FillSeries() []Fill {
	const span = 60
	if len(m.Timeline) <= span {
		return nil
	}
	var reqs, toks int64
	out := make([]Fill, 0, len(m.Timeline)-span)
	for i, s := range m.Timeline {
		reqs += s.Successes
		toks += s.SuccessTokens
		if i >= span {
			old := m.Timeline[i-span]
			reqs -= old.Successes
			toks -= old.SuccessTokens
			out = append(out, Fill{End: i, RPM: ratio(reqs, m.RPM), TPM: ratio(toks, m.TPM), Reqs: reqs, Toks: toks})
		}
	}
	return out
}

// SteadyStateFill returns the mean of FillSeries: how much of each limit
// successful calls used once the run was warm. It is 0 for runs shorter than
// 61 s and for unlimited dimensions.
func (m ModelStats) SteadyStateFill() (rpmFill, tpmFill float64) {
	series := m.FillSeries()
	if len(series) == 0 {
		return 0, 0
	}
	for _, f := range series {
		rpmFill += f.RPM
		tpmFill += f.TPM
	}
	n := float64(len(series))
	return rpmFill / n, tpmFill / n
}

func ratio(n int64, limit int) float64 {
	if limit == 0 {
		return 0
	}
	return float64(n) / float64(limit)
}

// Summary returns s without the per-key maps and timelines.
func (s Stats) Summary() Stats {
	s.IdempotencyCompletions, s.JobCompletions = nil, nil
	models := make(map[string]ModelStats, len(s.Models))
	for name, m := range s.Models {
		m.Timeline = nil
		models[name] = m
	}
	s.Models = models
	return s
}

// snapshot copies one model's statistics, with the timeline cut to the
// seconds elapsed by now.
func (m *modelState) snapshot(now int64) ModelStats {
	l := m.lim
	ms := ModelStats{
		Requests:           m.status.snapshot(),
		RPM:                int(l.rpm),
		TPM:                int(l.tpm),
		ShortWindowSeconds: l.short.seconds(),
		ShortRequests:      float64(l.shortReqs),
		ShortTokens:        float64(l.shortToks),
		AccelGrowth:        l.growth,
	}
	if l.short == winSecond {
		ms.BurstRequests, ms.BurstTokens = int(l.shortReqs), int(l.shortToks)
	}
	if l.growth > 0 {
		ms.AccelFloorRequests, ms.AccelFloorTokens = int(l.rampReqs), int(l.rampToks)
	}
	if l.bucketMS > 0 {
		ms.ShortWindowSeconds = float64(l.bucketMS) / 1000
		ms.ShortRequests = float64(l.rpm*l.bucketMS) / 60_000
		ms.ShortTokens = float64(l.tpm*l.bucketMS) / 60_000
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	minute, sec := m.log.peak[winMinute], m.log.peak[winSecond]
	ms.MaxRequestsIn60s, ms.MaxAdmittedRequestsIn60s, ms.MaxTokensIn60s = int(minute[dimReqs]), int(minute[dimAdm]), int(minute[dimTok])
	ms.MaxRequestsIn1s, ms.MaxAdmittedRequestsIn1s, ms.MaxTokensIn1s = int(sec[dimReqs]), int(sec[dimAdm]), int(sec[dimTok])
	if l.bucketMS == 0 && l.short != winSecond {
		short := m.log.peak[l.short]
		ms.MaxRequestsInShort, ms.MaxAdmittedRequestsInShort, ms.MaxTokensInShort = int(short[dimReqs]), int(short[dimAdm]), int(short[dimTok])
	}
	ms.Admitted, ms.RateLimited, ms.ChargedTokens = m.admitted, m.rateLimited, m.chargedTokens
	for r, n := range m.limitedBy {
		if n > 0 {
			if ms.RateLimitedBy == nil {
				ms.RateLimitedBy = map[string]int64{}
			}
			ms.RateLimitedBy[reasonNames[r]] = n
		}
	}
	if q := m.day; q != nil {
		for dim := range q.refused {
			if n := q.refused[dim].Load(); n > 0 {
				if ms.RateLimitedBy == nil {
					ms.RateLimitedBy = map[string]int64{}
				}
				ms.RateLimitedBy[dayLimitNames[dim]] = n
			}
		}
	}
	ms.SuccessRequests, ms.SuccessTokens = m.successRequests, m.successTokens
	ms.Timeline = m.elapsedTimeline(now)
	ms.Units = m.units.snapshot()
	return ms
}

func (m *modelState) elapsedTimeline(now int64) []Second {
	n := min(max((now-m.start)/int64(time.Second), 0), maxTimeline)
	if n == 0 {
		return nil
	}
	out := make([]Second, n)
	copy(out, m.timeline)
	return out
}

// snapshot copies the generation's statistics at now.
func (g *generation) snapshot(now time.Time) Stats {
	st := Stats{
		Requests:             g.status.snapshot(),
		Models:               make(map[string]ModelStats, len(g.models)),
		Completed:            g.completed.Load(),
		Replayed:             g.replayed.Load(),
		DuplicateCompletions: g.duplicates.Load(),
		ClientGone:           g.clientGone.Load(),
		ConnResets:           g.connResets.Load(),
		StreamCuts:           g.streamCuts.Load(),
		StreamStalls:         g.streamStalls.Load(),
		Streamed:             g.streamed.Load(),
		Hangs:                g.hangs.Load(),
		StartedAt:            g.started,
		Now:                  now,
	}
	for name, m := range g.models {
		st.Models[name] = m.snapshot(now.UnixNano())
	}
	g.mu.Lock()
	st.IdempotencyCompletions = maps.Clone(g.keyDone)
	st.JobCompletions = maps.Clone(g.jobDone)
	g.mu.Unlock()
	return st
}
