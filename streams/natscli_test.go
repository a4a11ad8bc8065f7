package streams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// cliLoad creates every stream and consumer from the files the way
// `nats stream add --config FILE` and `nats consumer add STREAM --config FILE`
// do: each file decoded as it is (unknown fields ignored, nothing filled in)
// and created with a create request (an existing object with another
// configuration is an error).
func cliLoad(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	streamFiles, _ := filepath.Glob("*.json")
	for _, f := range streamFiles {
		var c jetstream.StreamConfig
		decodeFile(t, f, &c)
		if _, err := js.CreateStream(ctx, c); err != nil {
			t.Fatalf("nats stream add --config %s: %v", f, err)
		}
	}
	consumerFiles, _ := filepath.Glob(filepath.Join("consumers", "*.json"))
	if len(streamFiles) < 5 || len(consumerFiles) < 4 {
		t.Fatalf("found %d stream and %d consumer files, want 5 and 4", len(streamFiles), len(consumerFiles))
	}
	for _, f := range consumerFiles {
		stream, _, _ := strings.Cut(filepath.Base(f), ".")
		var c jetstream.ConsumerConfig
		decodeFile(t, f, &c)
		if _, err := js.CreateConsumer(ctx, stream, c); err != nil {
			t.Fatalf("nats consumer add %s --config %s: %v", stream, f, err)
		}
	}
}

func decodeFile(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// Loading streams/ with the nats CLI first must not break `sluice up`, which
// then runs Ensure and creates each service's consumer, the executor's one
// per provider/model. (The executor template used to have no filter: on the
// DISPATCH work queue it overlapped every per-model consumer, and `sluice up`
// died with "filtered consumer not unique on workqueue stream", 10100.)
func TestStreamsLoadedWithTheNATSCLIThenSluiceUp(t *testing.T) {
	t.Parallel()
	s := natstest.Server(t)
	js, err := jetstream.New(natstest.Conn(t, s))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cliLoad(ctx, t, js)

	// What `sluice up` does at start, twice (a restart).
	models := [][2]string{{"sim", "gpt-4o-mini"}, {"openai", "gpt-4.1-mini"}, {"anthropic", "claude-haiku-4-5"}}
	for range 2 {
		if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
			t.Fatalf("Ensure after the CLI: %v", err)
		}
		for _, c := range [][2]string{{streams.Intake, "ingest"}, {streams.Results, "result"}} {
			if _, err := streams.EnsureConsumer(ctx, js, c[0], c[1], "", ""); err != nil {
				t.Fatalf("consumer %s.%s after the CLI: %v", c[0], c[1], err)
			}
		}
		for _, tenant := range []string{"acme", "globex"} {
			if _, err := streams.EnsureDurable(ctx, js, streams.Durable{Stream: streams.Queue, Template: "admission",
				Name: "admission-" + tenant, Filter: job.QueuePrefix + "*." + tenant, MaxAckPending: 100}); err != nil {
				t.Fatalf("tenant %s's QUEUE consumer after the CLI: %v", tenant, err)
			}
		}
		for _, m := range models {
			name := "executor-" + m[0] + "-" + job.ModelToken(m[1])
			if _, err := streams.EnsureConsumer(ctx, js, streams.Dispatch, "executor", name, job.DispatchSubject(m[0], m[1])); err != nil {
				t.Fatalf("executor consumer for %s/%s after the CLI: %v", m[0], m[1], err)
			}
		}
	}

	// A dispatched job reaches its model's consumer, not the template's.
	if _, err := js.Publish(ctx, job.DispatchSubject("sim", "gpt-4o-mini"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	// A consumer's pending count follows the publish a moment later: wait
	// for the end state rather than read it once.
	natstest.Eventually(t, 10*time.Second, func() error {
		for name, want := range map[string]uint64{"executor-sim-gpt-4o-mini": 1, "executor-openai-gpt-4_1-mini": 0, "executor": 0} {
			cons, err := js.Consumer(ctx, streams.Dispatch, name)
			if err != nil {
				return fmt.Errorf("consumer %s: %w", name, err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if got := info.NumPending; got != want {
				return fmt.Errorf("DISPATCH consumer %s: %d pending, want %d", name, got, want)
			}
		}
		return nil
	})
}

// A consumer that overlaps the executor's on DISPATCH (made by hand, or from
// the old template) is named in the error with the command that removes it.
func TestOverlappingConsumerIsNamed(t *testing.T) {
	t.Parallel()
	s := natstest.Server(t)
	js, err := jetstream.New(natstest.Conn(t, s))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, streams.Dispatch, jetstream.ConsumerConfig{Durable: "by-hand", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "sluice.dispatch.sim.*"}); err != nil {
		t.Fatal(err)
	}
	_, err = streams.EnsureConsumer(ctx, js, streams.Dispatch, "executor", "executor-sim-m", job.DispatchSubject("sim", "m"))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10100 {
		t.Fatalf("EnsureConsumer over an overlapping consumer: got %v, want JetStream error 10100", err)
	}
	for _, w := range []string{`"by-hand"`, "sluice.dispatch.sim.*", "nats consumer rm DISPATCH by-hand"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error: got %q, want it to contain %q", err, w)
		}
	}
}
