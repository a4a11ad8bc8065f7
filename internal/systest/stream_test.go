package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

type streamed struct {
	text   string
	usage  *openai.CompletionUsage
	jobID  string
	chunks int
	err    error
}

// readStream streams p through Sluice with the official SDK to its end.
func readStream(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams, stopAfter int) streamed {
	var resp *http.Response
	st := c.Chat.Completions.NewStreaming(ctx, p, option.WithResponseInto(&resp))
	defer st.Close()
	var out streamed
	var b strings.Builder
	for st.Next() {
		ch := st.Current()
		out.chunks++
		for _, choice := range ch.Choices {
			b.WriteString(choice.Delta.Content)
		}
		if ch.Usage.TotalTokens > 0 {
			u := ch.Usage
			out.usage = &u
		}
		if stopAfter > 0 && out.chunks >= stopAfter {
			break
		}
	}
	out.text, out.err = b.String(), st.Err()
	if resp != nil {
		out.jobID = resp.Header.Get("X-Sluice-Job-Id")
	}
	return out
}

// TestStreamThroughMesh: the official SDK streams through the whole mesh;
// the text equals the unstreamed answer to the same request, the usage
// chunk arrives, and a NATS subscriber to the job's stream subject sees
// the same chunks in order, the last marking the end.
func TestStreamThroughMesh(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}},
		PerToken: 2 * time.Millisecond, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := SDK(n)

	whole, err := c.Chat.Completions.New(ctx, StreamParams("Tell me about rivers.", 60))
	if err != nil {
		t.Fatal(err)
	}

	// As the tenant's own NATS user: its permissions cover its stream
	// subjects (live), nothing else.
	nc, err := nats.Connect(n.NATS, client.TenantUser("acme", "acme-key"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var onNATS []job.StreamMessage
	sub, err := nc.Subscribe(job.StreamPrefix+"acme.>", func(m *nats.Msg) {
		var sm job.StreamMessage
		if err := json.Unmarshal(m.Data, &sm); err != nil {
			t.Errorf("stream message: %v", err)
		}
		mu.Lock()
		onNATS = append(onNATS, sm)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	p := StreamParams("Tell me about rivers.", 60)
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	got := readStream(ctx, c, p, 0)
	if got.err != nil {
		t.Fatalf("stream: %v", got.err)
	}
	if want := whole.Choices[0].Message.Content; got.text != want || want == "" {
		t.Errorf("streamed text %q, want the unstreamed answer %q", got.text, want)
	}
	if got.usage == nil || got.usage.CompletionTokens != whole.Usage.CompletionTokens || got.usage.PromptTokens != whole.Usage.PromptTokens {
		t.Errorf("usage %+v, want %+v", got.usage, whole.Usage)
	}
	if got.jobID == "" {
		t.Error("no X-Sluice-Job-Id header")
	}
	if r := JobResult(t, n, got.jobID); r.Status != job.StatusSucceeded || ResponseText(t, r) != got.text || r.Usage == nil || r.Usage.CompletionTokens != int(whole.Usage.CompletionTokens) {
		t.Errorf("result %s, usage %+v; want succeeded with the streamed text and usage", r.Status, r.Usage)
	}

	// The NATS subscriber saw the same chunks, in order, and the end.
	var text strings.Builder
	mu.Lock()
	msgs := append([]job.StreamMessage(nil), onNATS...)
	mu.Unlock()
	chunks := 0
	for i, m := range msgs {
		for _, raw := range m.Chunks {
			var ch job.Chunk
			if err := json.Unmarshal(raw, &ch); err != nil {
				t.Fatal(err)
			}
			text.WriteString(ch.Text())
			chunks++
		}
		if (m.End != "") != (i == len(msgs)-1) {
			t.Errorf("message %d of %d: end %q; want the end on the last message only", i, len(msgs), m.End)
		}
	}
	if text.String() != got.text || chunks != got.chunks || len(msgs) == 0 || msgs[len(msgs)-1].End != job.StatusSucceeded {
		t.Errorf("over NATS: %d messages, %d chunks, text %q; want %d chunks with the streamed text, ending succeeded", len(msgs), chunks, text.String(), got.chunks)
	}
	if len(msgs) >= chunks {
		t.Errorf("%d messages for %d chunks: chunks are not batched", len(msgs), chunks)
	}

	// Without include_usage the usage chunk is stripped.
	if again := readStream(ctx, c, StreamParams("Tell me about rivers.", 60), 0); again.err != nil || again.usage != nil || again.text != got.text {
		t.Errorf("without include_usage: usage %+v, err %v, same text %v; want no usage chunk", again.usage, again.err, again.text == got.text)
	}
	if st := simSrv.Stats(); st.Streamed != 2 || st.DuplicateCompletions != 0 {
		t.Errorf("simulator: %d streamed, %d duplicates; want 2, 0", st.Streamed, st.DuplicateCompletions)
	}
}

// TestStreamFaultBeforeFirstToken: a stream cut before its first token is
// retried and the client never sees it: one extra provider call, one
// completion.
func TestStreamFaultBeforeFirstToken(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{RateStreamCut: 1, StreamCutAfter: 0, MaxFaults: 1}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := readStream(ctx, SDK(n), StreamParams("Once more.", 40), 0)
	if got.err != nil || got.text == "" {
		t.Fatalf("stream: text %q, err %v; want the whole answer", got.text, got.err)
	}
	st := simSrv.Stats()
	if st.StreamCuts != 1 || st.Streamed != 2 || st.JobCompletions[got.jobID] != 1 {
		t.Errorf("simulator: %d cuts, %d streams, %d completions of the job; want 1, 2, 1", st.StreamCuts, st.Streamed, st.JobCompletions[got.jobID])
	}
	if r := JobResult(t, n, got.jobID); r.Status != job.StatusSucceeded || r.Attempts != 2 || ResponseText(t, r) != got.text {
		t.Errorf("result %s after %d attempts; want succeeded after 2", r.Status, r.Attempts)
	}
}

// TestStreamCutAfterFirstToken: a cut after the first token reaches the
// client as an error, the provider was called once, and the job's result
// is interrupted with the text received.
func TestStreamCutAfterFirstToken(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{RateStreamCut: 1, StreamCutAfter: 3}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := readStream(ctx, SDK(n), StreamParams("Cut me off.", 40), 0)
	if got.err == nil {
		t.Fatal("a cut stream ended without an error")
	}
	if !strings.Contains(got.err.Error(), job.CodeStreamInterrupted) {
		t.Errorf("error %v, want %s", got.err, job.CodeStreamInterrupted)
	}
	if words := len(strings.Fields(got.text)); words != 3 {
		t.Errorf("client got %d words (%q), want the 3 sent", words, got.text)
	}
	r := JobResult(t, n, got.jobID)
	if r.Status != job.StatusInterrupted || r.Error == nil || r.Error.Code != job.CodeStreamInterrupted || ResponseText(t, r) != got.text {
		t.Errorf("result %s (%+v) with %q; want interrupted with %q", r.Status, r.Error, r.Response, got.text)
	}
	// The provider's usage never came: the result carries Sluice's.
	if r.UsageSource != job.UsageEstimate || r.Usage == nil || r.Usage.PromptTokens == 0 || r.Usage.CompletionTokens == 0 {
		t.Errorf("usage %+v from %q; want Sluice's estimate of prompt and text received", r.Usage, r.UsageSource)
	}
	// A wrong retry would keep the job in a stream: read the ledger once
	// none is left.
	Quiet(t, n, 30*time.Second)
	if st := simSrv.Stats(); st.Streamed != 1 || st.JobCompletions[got.jobID] != 1 {
		t.Errorf("simulator: %d streams, %d completions of the job; want exactly 1 provider call", st.Streamed, st.JobCompletions[got.jobID])
	}
}

// TestStreamTooLargeIsPaidOnce: a streamed answer past
// limits.max_response_bytes (here 1 MiB against a 64 KiB cap) is cut
// there, ends the caller's stream with response_too_large after the text
// already relayed, and is paid for once, through the SDK on its default
// retries.
func TestStreamTooLargeIsPaidOnce(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		PadResponseBytes: 1 << 20})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, "limits:\n  max_response_bytes: 65536\n"), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key")) // default retries
	got := readStream(ctx, c, StreamParams("Tell me everything.", 16), 0)
	if got.err == nil || !strings.Contains(got.err.Error(), job.CodeResponseTooLarge) {
		t.Fatalf("stream ended with %v, want %s", got.err, job.CodeResponseTooLarge)
	}
	if got.text == "" || len(got.text) > 64<<10 {
		t.Errorf("client got %d bytes of text, want the words before the cap and none of the padding past it", len(got.text))
	}
	r := JobResult(t, n, got.jobID)
	if r.Status != job.StatusFailed || r.Error == nil || r.Error.Code != job.CodeResponseTooLarge || len(r.Response) != 0 {
		t.Errorf("result %s (%+v) with %d bytes; want failed %s and nothing stored", r.Status, r.Error, len(r.Response), job.CodeResponseTooLarge)
	}
	Quiet(t, n, 30*time.Second) // a wrong retry would keep the job in a stream
	// The simulator counts the cut stream as done once its handler sees
	// the connection gone, which a loaded machine may leave for later.
	natstest.Eventually(t, 30*time.Second, func() error {
		if st := simSrv.Stats(); st.Completed == 0 {
			return fmt.Errorf("the simulator has not finished the stream (%d streams)", st.Streamed)
		}
		return nil
	})
	if st := simSrv.Stats(); st.Streamed != 1 || st.Completed != 1 {
		t.Errorf("simulator: %d streams, %d completions; want exactly 1 provider call", st.Streamed, st.Completed)
	}
}

// TestStreamCancelOnDisconnect: a streaming client that goes away stops
// the provider call and the job ends cancelled.
func TestStreamCancelOnDisconnect(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		PerToken: 50 * time.Millisecond, OutputTokens: func(max int, _ []byte) int { return max }})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sctx, leave := context.WithCancel(ctx)
	got := readStream(sctx, SDK(n), StreamParams("A long one.", 400), 3) // 400 tokens: 20 s
	leave()
	if got.jobID == "" || got.chunks != 3 {
		t.Fatalf("read %d chunks of job %q", got.chunks, got.jobID)
	}
	r := JobResult(t, n, got.jobID)
	if r.Status != job.StatusCancelled || r.Error == nil || r.Error.Code != job.CodeCancelled {
		t.Errorf("result %s (%+v), want cancelled", r.Status, r.Error)
	}
	if words := len(strings.Fields(ResponseText(t, r))); words == 0 || words >= 400 {
		t.Errorf("cancelled result holds %d words, want the partial text", words)
	}
	gone, stop := context.WithTimeout(ctx, 10*time.Second)
	natstest.Poll(gone, func() bool { return simSrv.Stats().ClientGone > 0 })
	stop()
	if st := simSrv.Stats(); st.ClientGone != 1 || st.JobCompletions[got.jobID] != 1 {
		t.Errorf("simulator: client gone %d, completions %d; want the call stopped (1, 1)", st.ClientGone, st.JobCompletions[got.jobID])
	}
}

// TestStreamGoClient: pkg/client's Stream yields the chunks of a job
// submitted over NATS.
func TestStreamGoClient(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), Env)
	_, operator := n.Connect(t)
	tnc, err := nats.Connect(n.NATS, client.TenantUser("acme", "acme-key"))
	if err != nil {
		t.Fatal(err)
	}
	defer tnc.Close()
	tenant, err := client.New(tnc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The operator's connection replays the stream from STREAMS; a
	// tenant's (no JetStream reads) watches its subjects before submitting.
	for name, cl := range map[string]*client.Client{"operator": operator, "tenant": tenant} {
		body := []byte(`{"model":"gpt-4o-mini","max_tokens":30,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`)
		var text strings.Builder
		var usage *job.ChunkUsage
		for ch, err := range cl.Stream(ctx, &job.Job{Tenant: "acme", Request: body}) {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			text.WriteString(ch.Text())
			if ch.Usage != nil {
				usage = ch.Usage
			}
		}
		if text.Len() == 0 || usage == nil || usage.CompletionTokens != len(strings.Fields(text.String())) {
			t.Errorf("%s: text %q, usage %+v", name, text.String(), usage)
		}
		// A job that cannot run ends the stream with its error.
		bad := []byte(`{"model":"gpt-4o-mini","max_tokens":999999,"messages":[{"role":"user","content":"hi"}]}`)
		var last error
		for _, err := range cl.Stream(ctx, &job.Job{Tenant: "acme", Request: bad}) {
			last = err
		}
		if last == nil || !strings.Contains(fmt.Sprint(last), "max_tokens") {
			t.Errorf("%s: invalid job: %v, want its validation error", name, last)
		}
	}
}

// TestStreamTimeouts: a stream silent before its first token past
// first_token_timeout is retried unseen; one silent after it past
// idle_timeout ends interrupted (reason idle_timeout).
func TestStreamTimeouts(t *testing.T) {
	t.Parallel()
	extra := "streaming: {first_token_timeout: 300ms, idle_timeout: 300ms}\n"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	firstSim, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{RateStreamStall: 1, StreamStallAfter: 0, MaxFaults: 1, HangFor: 10 * time.Second}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, extra), Env)
	got := readStream(ctx, SDK(n), StreamParams("Slow start.", 30), 0)
	if got.err != nil || got.text == "" {
		t.Errorf("first-token timeout: text %q, err %v; want the answer of the retry", got.text, got.err)
	}
	if st := firstSim.Stats(); st.StreamStalls != 1 || st.Streamed != 2 {
		t.Errorf("first-token timeout: %d stalls, %d streams; want 1, 2", st.StreamStalls, st.Streamed)
	}

	idleSim, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{RateStreamStall: 1, StreamStallAfter: 2, HangFor: 10 * time.Second}})
	n = Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 200000, extra), Env)
	got = readStream(ctx, SDK(n), StreamParams("Stall midway.", 30), 0)
	if got.err == nil || len(strings.Fields(got.text)) != 2 {
		t.Errorf("idle timeout: text %q, err %v; want 2 words and an error", got.text, got.err)
	}
	r := JobResult(t, n, got.jobID)
	if r.Status != job.StatusInterrupted || r.Error == nil || !strings.Contains(r.Error.Message, "idle_timeout") {
		t.Errorf("idle timeout: result %s (%+v), want interrupted by idle_timeout", r.Status, r.Error)
	}
	if st := idleSim.Stats(); st.Streamed != 1 {
		t.Errorf("idle timeout: %d streams, want 1 (never retried)", st.Streamed)
	}
}
