package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/embedded"
)

// JetStreamRates are JetStream's own rates, measured on the server
// configuration the overhead benchmark's node embeds (embedded.Start, a
// file store in a temporary directory) over one loopback TCP connection,
// as the node's own connection is: each operation waits for the one
// before it, so they are the rates of a serial pipeline.
type JetStreamRates struct {
	// SyncPublishPerS: publishes to a file-store work-queue stream, each
	// waiting for its acknowledgement.
	SyncPublishPerS float64 `json:"sync_publish_per_s"`
	// AsyncPublishPerS: the same publishes without waiting for each
	// acknowledgement (all awaited at the end).
	AsyncPublishPerS float64 `json:"async_publish_per_s"`
	// PullAckPerS: a durable pull consumer fetching one message and
	// acknowledging it with a double ack (AckSync: the server confirms),
	// one message at a time.
	PullAckPerS float64 `json:"pull_ack_per_s"`
	// KVPutPerS: puts of distinct keys to a file-store KV bucket.
	KVPutPerS float64 `json:"kv_put_per_s"`
	// Ops is how many operations each rate was measured over.
	Ops int `json:"ops"`
}

// Ceiling is the throughput of the naive durable pipeline the overhead
// benchmark compares Sluice with: per job, two synchronous publishes (the
// producer's, and the worker's publish of its result) and one
// pull-and-double-ack (the worker taking the job), done one after the
// other: 1 / (2/SyncPublishPerS + 1/PullAckPerS) jobs per second.
func (r JetStreamRates) Ceiling() float64 {
	if r.SyncPublishPerS <= 0 || r.PullAckPerS <= 0 {
		return 0
	}
	return 1 / (2/r.SyncPublishPerS + 1/r.PullAckPerS)
}

// meanRates averages two measurements (the overhead benchmark measures
// before and after Sluice's run, so load that comes and goes affects both
// sides alike).
func meanRates(a, b JetStreamRates) JetStreamRates {
	return JetStreamRates{
		SyncPublishPerS:  (a.SyncPublishPerS + b.SyncPublishPerS) / 2,
		AsyncPublishPerS: (a.AsyncPublishPerS + b.AsyncPublishPerS) / 2,
		PullAckPerS:      (a.PullAckPerS + b.PullAckPerS) / 2,
		KVPutPerS:        (a.KVPutPerS + b.KVPutPerS) / 2,
		Ops:              a.Ops + b.Ops,
	}
}

// freshServer starts an embedded server, as the overhead benchmark's node
// embeds, with a file store in a new temporary directory; stop shuts it
// down and removes the directory.
func freshServer(prefix string) (ns *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, nil, err
	}
	ns, err = embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return ns, func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}, nil
}

// MeasureJetStream measures JetStreamRates with ops operations each (the
// asynchronous publishes: ten times as many) on a fresh embedded server,
// with messages of the size of a small job envelope.
func MeasureJetStream(ctx context.Context, ops int) (JetStreamRates, error) {
	rates := JetStreamRates{Ops: ops}
	ns, stop, err := freshServer("sluice-jsrates-")
	if err != nil {
		return rates, err
	}
	defer stop()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return rates, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return rates, err
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RATES", Subjects: []string{"rates.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		return rates, fmt.Errorf("create stream: %w", err)
	}
	payload := make([]byte, 400)
	for i := range payload {
		payload[i] = 'x'
	}
	rate := func(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

	// Synchronous publishes, each with a message id as Sluice sends.
	began := time.Now()
	for i := range ops {
		msg := nats.NewMsg("rates.sync")
		msg.Data = payload
		msg.Header.Set(jetstream.MsgIDHeader, "s"+strconv.Itoa(i))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return rates, fmt.Errorf("publish: %w", err)
		}
	}
	rates.SyncPublishPerS = rate(ops, time.Since(began))

	// Pull and double-ack what was published, one message at a time.
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "rates", AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubject: "rates.sync"})
	if err != nil {
		return rates, fmt.Errorf("create consumer: %w", err)
	}
	began = time.Now()
	for got := 0; got < ops; {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return rates, fmt.Errorf("fetch: %w", err)
		}
		for msg := range batch.Messages() {
			if err := msg.DoubleAck(ctx); err != nil {
				return rates, fmt.Errorf("ack: %w", err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			return rates, fmt.Errorf("fetch: %w", err)
		}
	}
	rates.PullAckPerS = rate(ops, time.Since(began))

	// Asynchronous publishes, awaited every 1,000 (below the client's
	// limit on pending acknowledgements).
	async := ops * 10
	began = time.Now()
	for i := range async {
		msg := nats.NewMsg("rates.async")
		msg.Data = payload
		msg.Header.Set(jetstream.MsgIDHeader, "a"+strconv.Itoa(i))
		if _, err := js.PublishMsgAsync(msg); err != nil {
			return rates, fmt.Errorf("publish async: %w", err)
		}
		if (i+1)%1000 == 0 || i == async-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return rates, ctx.Err()
			}
		}
	}
	rates.AsyncPublishPerS = rate(async, time.Since(began))

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "rates", Storage: jetstream.FileStorage})
	if err != nil {
		return rates, fmt.Errorf("create bucket: %w", err)
	}
	began = time.Now()
	for i := range ops {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), payload[:200]); err != nil {
			return rates, fmt.Errorf("kv put: %w", err)
		}
	}
	rates.KVPutPerS = rate(ops, time.Since(began))
	return rates, nil
}
