// Package sim is an OpenAI-compatible provider simulator. Sluice's tests,
// demos and benchmarks point at it instead of a real LLM API: it answers
// POST /v1/chat/completions the way a provider does, including the way it
// rate-limits, fails and de-duplicates.
//
// # Rate limits
//
// Every configured model has a requests-per-minute (RPM) and a
// tokens-per-minute (TPM) limit. At arrival a request is charged one request
// and prompt + max output tokens (the prompt counted by package tokens, the
// output limit taken from max_completion_tokens, max_tokens or
// Config.DefaultMaxTokens). Nothing is refunded when the completion is
// shorter: providers document that they charge the maximum at arrival.
//
// Four constraints are enforced, each over a trailing window measured at
// arrival time: RPM and TPM over the last 60 s, and a burst cap per second
// for each (max(ceil(limit·BurstFraction), 1) over the last 1 s). A request
// alone in its second never trips the token burst cap, so a request larger
// than the cap still runs if the minute has room. A request larger than TPM
// can never run and is rejected as too large, without Retry-After.
//
// A window (t-60s, t] holds every charge made after t-60s. The simulator
// keeps an exact log of charges (arrival instants are taken to the
// millisecond; one entry per distinct millisecond), so admission is exact: no
// trailing window, of any phase, ever holds more than a limit admits. A rejected request still counts one request against RPM
// (as OpenAI counts it) but charges no tokens. Its Retry-After is the real
// time until the same request would fit, counting the rejection itself, so a
// client that waits exactly that long (and sends nothing else) is admitted.
//
// Every chat-completions response for a known model (200, replays, 429s and
// 5xx faults) carries OpenAI's x-ratelimit-* headers for the limited
// dimensions: limit, remaining over the last 60 s after this request's
// charge, and reset, the time until the 60-s window is empty again.
//
// # Latency and completions
//
// An admitted request is answered after Config.TTFT + Config.PerToken per
// output token. The output length comes from Config.OutputTokens (by default
// a value in [max/4, max/2] derived from a hash of the body), and the content
// is deterministic filler text; the prompt is never echoed or logged. If the
// client goes away while waiting, the work still counts as completed (the
// provider did it) and is kept for idempotent replay.
//
// # Idempotency and duplicates
//
// A request carrying an Idempotency-Key is executed once: the first admitted
// request with the key runs, and later ones replay its stored response (same
// id, header Idempotent-Replayed: true) without being charged. A request
// arriving while the first is still running waits for it. If the first fails
// (429, fault), the key is released and the next request with it runs.
// Stats counts completions per Idempotency-Key and per X-Sluice-Job-Id, and
// DuplicateCompletions counts completions beyond the first for either, so
// tests can assert that no operation ran twice.
//
// # Faults
//
// Config.Faults injects provider failures with a fixed seed: 500/502/503
// answers, connection resets and hangs, decided per admitted request (they
// are charged, and never count as completed), and insufficient_quota 429s for
// chosen models or API keys (checked before the limits, not charged). The
// n-th admitted request since start (or Reset) always gets the same roll.
//
// # Statistics
//
// Stats reports status counts, the exact maximum of every window over the
// run, a per-second timeline and completion counters. GET /stats serves it
// as JSON (?summary=1 leaves out the per-key maps and timelines) and
// POST /reset clears everything between runs.
package sim
