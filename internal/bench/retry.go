package bench

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// RetryPolicy is the "just retry" client's policy: exponential backoff with
// full jitter, Retry-After as a floor, a bounded number of attempts.
type RetryPolicy struct {
	MaxAttempts int
	Base, Max   time.Duration
}

// DefaultRetry is what the direct strategies (and, for a fair comparison,
// Sluice's retry classes) use: 8 attempts, 500 ms base, 30 s cap.
var DefaultRetry = RetryPolicy{MaxAttempts: 8, Base: 500 * time.Millisecond, Max: 30 * time.Second}

// outcome is how one provider call ended.
type outcome struct {
	status     int // 0 when no response arrived
	ok         bool
	retryable  bool
	retryAfter time.Duration
	usage      job.Usage
}

// call POSTs one chat-completions body and classifies the answer the way a
// plain client does: 429 (except insufficient_quota), 5xx and network errors
// are worth retrying, other errors are not.
func call(ctx context.Context, hc *http.Client, url string, body []byte) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return outcome{}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return outcome{retryable: ctx.Err() == nil}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	o := outcome{status: resp.StatusCode}
	switch {
	case err != nil:
		o.retryable = ctx.Err() == nil
	case resp.StatusCode/100 == 2:
		o.ok, o.usage = true, provider.ParseUsage(data)
	case resp.StatusCode == http.StatusTooManyRequests:
		o.retryable = !strings.Contains(string(data), "insufficient_quota")
		o.retryAfter = provider.ParseRetryAfter(resp.Header, time.Now())
	case resp.StatusCode >= 500:
		o.retryable = true
		o.retryAfter = provider.ParseRetryAfter(resp.Header, time.Now())
	}
	return o
}

// caller runs the retry loop of the direct strategies for one job.
type caller struct {
	hc     *http.Client
	url    string
	policy RetryPolicy
	// limiter, when set, is waited on before every attempt (every attempt is
	// a request the provider counts).
	limiter *Limiter
	// settle, when set, hands back the tokens a finished attempt did not
	// use: max_tokens - completion_tokens after a success, the whole cost
	// after a 429 (a rejected call is not charged tokens).
	settle bool
}

// do runs attempts until one succeeds, one fails for good, the policy's
// attempts are spent or ctx ends. It returns whether the job succeeded and
// how many calls it made.
func (c *caller) do(ctx context.Context, j Job, rnd *rand.Rand) (ok bool, attempts int) {
	for attempt := 1; ; attempt++ {
		if c.limiter != nil {
			if err := c.limiter.Wait(ctx, j.Cost()); err != nil {
				return false, attempt - 1
			}
		}
		o := call(ctx, c.hc, c.url, j.Body)
		if c.settle && c.limiter != nil {
			switch {
			case o.ok:
				c.limiter.Refund(j.MaxTokens - o.usage.CompletionTokens)
			case o.status == http.StatusTooManyRequests:
				c.limiter.Refund(j.Cost())
			}
		}
		if o.ok {
			return true, attempt
		}
		if !o.retryable || attempt >= max(c.policy.MaxAttempts, 1) {
			return false, attempt
		}
		d := provider.Backoff(attempt, c.policy.Base, c.policy.Max, o.retryAfter, rnd)
		if !sleep(ctx, d) {
			return false, attempt
		}
	}
}

// newHTTPClient makes a client with enough idle connections for conc calls.
func newHTTPClient(conc int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = conc + 16
	t.MaxIdleConnsPerHost = conc + 16
	return &http.Client{Transport: t}
}
