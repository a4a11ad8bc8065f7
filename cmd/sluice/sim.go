package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

const simUsage = `Usage: sluice sim [flags]

sluice sim serves an OpenAI-compatible provider simulator: POST /v1/chat/completions,
GET /v1/models, GET /stats (what it admitted and rejected, window by window) and
POST /reset. Every model's RPM and TPM hold over any 60-s window, rejected requests
counting against RPM; --profile picks the shorter-term limit, as providers document:

  quantized      limit/60 in any 1-s window (--burst-fraction), as OpenAI (default)
  token-bucket   a bucket refilled at limit/60 per second, holding --bucket-seconds
                 of refill, as Anthropic
  azure          limit/6 in any 10-s window; only x-ratelimit-remaining-* headers,
                 as Azure OpenAI
  acceleration   quantized, and what is admitted in any 10 s may not exceed the
                 larger of limit/6 x 0.25 and twice the 10 s before, like
                 Anthropic's acceleration limits
  hidden         quantized, with no x-ratelimit-* headers and 429 messages that
                 name no numbers

A 429 carries retry-after-ms and Retry-After: the exact time until the same request
would fit.

Batch APIs: OpenAI's (POST /v1/files purpose=batch, /v1/batches) and Anthropic's
Message Batches (/v1/messages/batches) answer each line as the synchronous call,
outside the rate limits; --batch-duration, --batch-expiry, --batch-enqueued-tokens
and --batch-queue shape them.

Tools and JSON: a request whose tool_choice requires a call ("required", a named
function; Anthropic's any or tool) is answered with one, its arguments the smallest
value valid for the tool's parameters schema; --tool-calls N also answers tool_choice
auto with calls for N rounds. response_format json_schema is answered with JSON valid
for the schema, json_object with a JSON object.

Flags:
`

func runSim(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), simUsage)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the OpenAI-compatible API on")
	models := fs.String("models", "gpt-4o-mini=500/200000", "models and limits: name=RPM/TPM[/RPD/TPD][,...] (0 = unlimited; RPD/TPD are per-day quotas); with --profile anthropic, name=RPM/ITPM/OTPM")
	profile := fs.String("profile", sim.DefaultProfile, "how limits are enforced: "+strings.Join(sim.Profiles(), ", "))
	burst := fs.Float64("burst-fraction", sim.DefaultBurstFraction, "quantized, acceleration, hidden: cap of any 1-s window as a fraction of each per-minute limit (1/60: the average pace)")
	bucket := fs.Float64("bucket-seconds", sim.DefaultBucketSeconds, "token-bucket, anthropic: bucket capacity in seconds of refill (refill is limit/60 per second)")
	noHeaders := fs.Bool("no-rate-headers", false, "send no x-ratelimit-* headers, whatever the profile")
	ttft := fs.Duration("ttft", 200*time.Millisecond, "latency before the first token")
	perToken := fs.Duration("per-token", 2*time.Millisecond, "latency per output token")
	apiKey := fs.String("api-key", "", "require this bearer key (default: any)")
	seed := fs.Int64("seed", 1, "fault injection seed")
	f500 := fs.Float64("fault-500", 0, "fraction of admitted requests answered 500")
	f502 := fs.Float64("fault-502", 0, "fraction answered 502")
	f503 := fs.Float64("fault-503", 0, "fraction answered 503 server_is_overloaded")
	fReset := fs.Float64("fault-reset", 0, "fraction whose connection is reset before any response")
	fHang := fs.Float64("fault-hang", 0, "fraction that never get an answer")
	fCut := fs.Float64("fault-stream-cut", 0, "fraction of streamed answers cut (connection reset) after --stream-cut-after tokens")
	cutAfter := fs.Int("stream-cut-after", 0, "tokens a cut stream delivers first (0: cut before the first token)")
	fStall := fs.Float64("fault-stream-stall", 0, "fraction of streamed answers that stop, silent, after --stream-stall-after tokens")
	stallAfter := fs.Int("stream-stall-after", 0, "tokens a stalled stream delivers first")
	count := fs.String("token-count", sim.CountChars, "how prompt tokens are counted: chars (characters/4 plus per-message overhead, as an independent provider) or sluice (Sluice's own estimator)")
	countFactor := fs.Float64("token-factor", 1, "scale every prompt count by this (1.15: the provider counts 15% more; 0.6: 40% less)")
	ignoreKey := fs.Bool("ignore-idempotency-key", false, "run every request, even one repeating an Idempotency-Key (as OpenAI and Anthropic document their completions); completions are still counted per key")
	quota := fs.String("quota-models", "", "comma-separated models that answer 429 insufficient_quota")
	batchDur := fs.Duration("batch-duration", 30*time.Second, "Batch APIs: how long a batch takes, its lines finishing evenly over it")
	batchExpiry := fs.Duration("batch-expiry", sim.DefaultBatchExpiry, "Batch APIs: a batch's lines not answered this long after its creation expire")
	batchTokens := fs.Int64("batch-enqueued-tokens", 0, "OpenAI Batch API: per-model limit on the prompt tokens of batches not yet ended; a batch over it fails with token_limit_exceeded (0 = unlimited)")
	batchQueue := fs.Int("batch-queue", 0, "Anthropic Message Batches: limit on requests waiting in the processing queue, all models; a batch over it gets a 429 (0 = unlimited)")
	toolCalls := fs.Int("tool-calls", 0, "answer a request offering tools with tool_choice auto (or none given) with a tool call while its conversation holds fewer than this many tool results (0: text); tool_choice required or a named tool is always answered with a call")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if err := checkProfileFlags(fs, *profile); err != nil {
		return err
	}
	split := *profile == sim.ProfileAnthropic
	if split && !flagSet(fs, "models") {
		*models = "claude-3-5-haiku-latest=50/50000/10000"
	}
	ml, err := parseModels(*models, split)
	if err != nil {
		return fmt.Errorf("--models: %w", err)
	}
	cfg := sim.Config{Models: ml, Profile: *profile, BurstFraction: *burst, BucketSeconds: *bucket, NoRateHeaders: *noHeaders,
		Batch:                sim.BatchConfig{Duration: *batchDur, Expiry: *batchExpiry, EnqueuedTokens: *batchTokens, QueueRequests: *batchQueue},
		IgnoreIdempotencyKey: *ignoreKey, ToolCalls: *toolCalls, TTFT: *ttft, PerToken: *perToken, Count: sim.TokenCount{Mode: *count, Factor: *countFactor},
		Faults: sim.Faults{Seed: *seed, Rate500: *f500, Rate502: *f502, Rate503: *f503, RateReset: *fReset, RateHang: *fHang,
			RateStreamCut: *fCut, StreamCutAfter: *cutAfter, RateStreamStall: *fStall, StreamStallAfter: *stallAfter}}
	if *apiKey != "" {
		cfg.APIKeys = []string{*apiKey}
	}
	if *quota != "" {
		cfg.Faults.QuotaModels = strings.Split(*quota, ",")
	}
	s, err := sim.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "sluice sim: OpenAI-compatible API on http://%s/v1 (profile %s; stats: GET /stats)\n", ln.Addr(), s.Stats().Profile)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		return err
	}
}

// flagSet reports whether the command line set the named flag.
func flagSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// checkProfileFlags refuses a profile flag that the chosen profile would
// ignore, rather than run with a setting that has no effect.
func checkProfileFlags(fs *flag.FlagSet, profile string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		switch {
		case err != nil:
		case f.Name == "burst-fraction" && (profile == sim.ProfileAzure || profile == sim.ProfileTokenBucket):
			err = fmt.Errorf("--burst-fraction has no effect with --profile %s (no 1-s window)", profile)
		case f.Name == "bucket-seconds" && profile != sim.ProfileTokenBucket && profile != sim.ProfileAnthropic:
			err = fmt.Errorf("--bucket-seconds has no effect with --profile %s (token-bucket and anthropic only)", profile)
		}
	})
	return err
}

// parseModels reads "name=RPM/TPM,name=RPM/TPM/RPD/TPD": per-minute
// limits, and optionally per-day quotas; or, for the anthropic profile
// (split), "name=RPM/ITPM/OTPM": Anthropic's separate input and output
// token limits.
func parseModels(s string, split bool) ([]sim.ModelLimits, error) {
	want := "want name=RPM/TPM or name=RPM/TPM/RPD/TPD"
	if split {
		want = "want name=RPM/ITPM/OTPM (--profile anthropic)"
	}
	var out []sim.ModelLimits
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, lim, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: %s", part, want)
		}
		fields := strings.Split(lim, "/")
		if split && len(fields) != 3 || !split && len(fields) != 2 && len(fields) != 4 {
			return nil, fmt.Errorf("%q: %s", part, want)
		}
		v := make([]int, 4)
		for i, f := range fields {
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%q: limits must be non-negative integers", part)
			}
			v[i] = n
		}
		if split {
			out = append(out, sim.ModelLimits{Name: name, RPM: v[0], ITPM: v[1], OTPM: v[2]})
			continue
		}
		out = append(out, sim.ModelLimits{Name: name, RPM: v[0], TPM: v[1], RPD: v[2], TPD: v[3]})
	}
	if len(out) == 0 {
		return nil, errors.New("no models")
	}
	return out, nil
}
