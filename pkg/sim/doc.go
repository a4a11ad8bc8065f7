// Package sim is an OpenAI-compatible provider simulator, for Sluice's own
// tests, demos and benchmarks and for users' tests of code that calls a
// rate-limited LLM API. It answers POST /v1/chat/completions (streamed or
// not), /v1/responses, /v1/embeddings, Anthropic's /v1/messages and GET
// /v1/models the way a provider does, including the way it rate-limits, fails and de-duplicates,
// and keeps a ledger of what it saw ([Server.Stats]). It also serves both
// providers' Batch APIs (batch.go), with their own limits and a ledger of
// what each batch line cost ([Server.BatchLines]).
//
// # Rate limits
//
// Every configured model has a requests-per-minute (RPM) and a
// tokens-per-minute (TPM) limit. At arrival a request is charged one request
// and prompt + max output tokens (the prompt counted as Config.Count says:
// by default characters/4 with its own framing, not as Sluice estimates; the
// output limit taken from max_completion_tokens, max_tokens or
// Config.DefaultMaxTokens). Nothing is refunded when the completion is
// shorter: providers document that they charge the maximum at arrival.
//
// Config.Profile decides how the limits are enforced. Every profile
// enforces RPM and TPM over a sliding 60-s window and adds a shorter-term
// limit, as the providers document theirs:
//
//   - quantized (the default): a sliding 1-s window capped at
//     max(ceil(limit/60), 1) (Config.BurstFraction overrides the 1/60), as
//     OpenAI enforces 60,000 requests per minute as 1,000 per second.
//   - token-bucket: per dimension a bucket refilled continuously at limit/60
//     per second, holding Config.BucketSeconds seconds of refill, starting
//     full, as Anthropic describes its limits. A request costing more than
//     the capacity is admitted only when the bucket is full, and empties it.
//     Rejected requests draw nothing from the buckets.
//   - azure: sliding 10-s windows capped at max(ceil(limit/6), 1), as Azure
//     OpenAI evaluates RPM and TPM over short windows; no 1-s window.
//   - acceleration: quantized, plus a ramp limit, like Anthropic's
//     acceleration limits: what was admitted in the trailing 10 s may not
//     exceed the larger of limit/6·Config.AccelFloor and Config.AccelGrowth
//     times what was admitted in the 10 s before that.
//   - hidden: quantized, but without x-ratelimit-* headers and with 429
//     messages that name no numbers.
//
// A request alone in its short window (1 s, 10 s, or the ramp's trailing
// 10 s) is never rejected by that window's token cap, so a request larger
// than the cap still runs if the minute has room. A request larger than TPM
// can never run and is rejected as too large, without Retry-After.
//
// A model may also limit other units per minute (ModelLimits.Units:
// images, audio seconds). Under every profile a unit is enforced as
// quantized enforces requests and tokens, the request's amounts read from
// its body by Config.UnitsOf (default: the "sim_units" field; a unit it
// does not name costs 1), and counted per unit in Stats (see units.go).
//
// A model may have per-day quotas (ModelLimits.RPD, TPD): the requests and
// tokens admitted in the trailing 24 h, in one-minute buckets, judged
// before the rate limits and charged once they admit a request. A request
// over one gets a 429 in OpenAI's words ("... on requests per day (RPD):
// Limit 200, Used 200, Requested 1. Please try again in 7h12m0s.") with
// Retry-After set to when the quota has room (see day.go).
//
// A window (t-60s, t] holds every charge made after t-60s. The simulator
// keeps an exact log of charges (arrival instants are taken to the
// millisecond; one entry per distinct millisecond), so admission is exact:
// no trailing window, of any phase, ever holds more than a limit admits, and
// buckets are exact integers. A rejected request still counts one request
// against RPM and the short request windows (as OpenAI counts it) but
// charges no tokens. Its Retry-After is the real time until the same request
// would fit under the profile, counting the rejection itself, so a client
// that waits exactly that long (and sends nothing else) is admitted, and
// one that waits a millisecond less is not.
//
// Every chat-completions response for a known model (200, replays, 429s and
// 5xx faults) carries OpenAI's x-ratelimit-* headers for the limited
// dimensions: limit, remaining over the last 60 s after this request's
// charge, and reset, the time until the 60-s window is empty again. They
// describe the minute only, never the short-term limit, as OpenAI's do.
// Under azure only the remaining requests and tokens are sent, as Azure
// does; under hidden, or with Config.NoRateHeaders, none. 429s carry
// retry-after-ms and Retry-After (whole seconds, rounded up) in every
// profile, and OpenAI's body: type "requests" or "tokens", code
// rate_limit_exceeded; a rejection by the ramp says "acceleration limit".
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
// tests can assert that no operation ran twice. With
// Config.IgnoreIdempotencyKey the key is ignored, as OpenAI and Anthropic
// document nothing else for completions: every request runs.
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
// Stats reports the profile and each model's short-term caps, status
// counts, the exact maximum of every window over the run, rejections by the
// limit that caused them, a per-second timeline and completion counters, so
// that a benchmark can show the profile was respected. GET /stats serves it
// as JSON (?summary=1 leaves out the per-key maps and timelines) and
// POST /reset clears everything between runs.
package sim
