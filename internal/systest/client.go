package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// SDK is the official OpenAI SDK pointed at the node as tenant acme, with
// no retries of its own.
func SDK(n Node) openai.Client {
	return openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey(Env["ACME_KEY"]), option.WithMaxRetries(0))
}

// StreamParams is the seeded request the streaming tests send.
func StreamParams(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(maxTokens),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

// JobResult reads GET /v1/jobs/{id}?wait=20s as acme and fails the test
// unless it holds a result.
func JobResult(t testing.TB, n Node, id string) *job.Result {
	t.Helper()
	return JobResultWithin(t, n, id, "20s")
}

// JobResultWithin is JobResult waiting up to wait (a duration, at most
// the server's bound on ?wait).
func JobResultWithin(t testing.TB, n Node, id, wait string) *job.Result {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, n.HTTP+"/v1/jobs/"+id+"?wait="+wait, nil)
	req.Header.Set("Authorization", "Bearer "+Env["ACME_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status job.Status  `json:"status"`
		Result *job.Result `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Result == nil {
		t.Fatalf("job %s: no result (status %s)", id, body.Status)
	}
	return body.Result
}

// ResponseText is the text of a chat completion's first choice.
func ResponseText(t testing.TB, r *job.Result) string {
	t.Helper()
	var c openai.ChatCompletion
	if err := json.Unmarshal(r.Response, &c); err != nil || len(c.Choices) == 0 {
		t.Fatalf("result response %s: %v", r.Response, err)
	}
	return c.Choices[0].Message.Content
}

// MetricSum sums a counter's samples in base's /metrics whose labels
// contain every one of the given fragments.
func MetricSum(t testing.TB, base, name string, fragments ...string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	var sum float64
next:
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		for _, f := range fragments {
			if !strings.Contains(m[1], f) {
				continue next
			}
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum
}

// GetJob reads GET /v1/jobs/{id}[?wait=] with key ("": none) and fails
// the test unless it answers 200 with JSON.
func GetJob(t testing.TB, ctx context.Context, base, key, id, wait string) map[string]any {
	t.Helper()
	url := base + "/v1/jobs/" + id
	if wait != "" {
		url += "?wait=" + wait
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v %v", url, resp.StatusCode, out, err)
	}
	return out
}

// DumpStreams logs the state of the job streams and their consumers, for
// a test that failed to find out where a job stopped.
func DumpStreams(t testing.TB, n Node) {
	t.Helper()
	nc, err := nats.Connect(n.NATS, append([]nats.Option{nats.Timeout(natstest.ConnectTimeout)}, n.NATSOptions...)...)
	if err != nil {
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	for _, name := range []string{streams.Intake, streams.Queue, streams.Dispatch, streams.Results} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			continue
		}
		info, _ := st.Info(ctx)
		t.Logf("stream %s: msgs=%d first=%d last=%d", name, info.State.Msgs, info.State.FirstSeq, info.State.LastSeq)
		for ci := range st.ListConsumers(ctx).Info() {
			t.Logf("  consumer %s: delivered=%d ackfloor=%d pending=%d ackpending=%d redelivered=%d waiting=%d", ci.Name, ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting)
		}
	}
}

// Quiet waits (up to within) until INTAKE, QUEUE and DISPATCH hold no
// message: every job accepted has ended and none is waiting to be tried
// again (a service publishes a job's next step before it acks the
// current one, so a live job is always in one of them). A test that
// proves a job was not retried checks the provider after Quiet, rather
// than after a sleep.
func Quiet(t testing.TB, n Node, within time.Duration) {
	t.Helper()
	nc, err := nats.Connect(n.NATS, append([]nats.Option{nats.Timeout(natstest.ConnectTimeout)}, n.NATSOptions...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	QuietOn(t, nc, within)
}

// QuietOn is Quiet on a connection of the test's own.
func QuietOn(t testing.TB, nc *nats.Conn, within time.Duration) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	natstest.Eventually(t, within, func() error {
		for _, name := range []string{streams.Intake, streams.Queue, streams.Dispatch} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				return err
			}
			info, err := st.Info(ctx)
			if err != nil {
				return err
			}
			if info.State.Msgs > 0 {
				return fmt.Errorf("%s holds %d messages", name, info.State.Msgs)
			}
		}
		return nil
	})
}

// AllResultsIn is QuietOn, then waits until sub (a subscription of nc to
// results) has handled every message sent to it before: after it, a test
// that counts results per job has seen every result there will be.
func AllResultsIn(t testing.TB, nc *nats.Conn, sub *nats.Subscription, within time.Duration) {
	t.Helper()
	QuietOn(t, nc, within)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, within, func() error {
		if m, _, err := sub.Pending(); err != nil || m > 0 {
			return fmt.Errorf("%d results not yet handled (%v)", m, err)
		}
		return nil
	})
}
