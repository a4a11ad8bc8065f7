// Package streams holds Sluice's JetStream objects as JSON (the format
// `nats stream add --config`, `nats consumer add --config` and
// `nats kv add` read), embedded in the binary, and creates or updates them.
package streams

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

//go:embed *.json consumers/*.json kv/*.json
var files embed.FS

// Names of the objects.
const (
	Intake   = "INTAKE"
	Queue    = "QUEUE"
	Dispatch = "DISPATCH"
	Results  = "RESULTS"
	DLQ      = "DLQ"

	BucketBudgets     = "budgets"
	BucketIdempotency = "idempotency"
	BucketResults     = "results"
)

// Options adjust the embedded definitions at start.
type Options struct {
	Replicas        int           // 0 keeps the file's value
	ResultRetention time.Duration // RESULTS max_age and results/idempotency TTL; 0 keeps the files'
}

// Streams returns the stream definitions, sorted by name.
func Streams() ([]jetstream.StreamConfig, error) {
	var out []jetstream.StreamConfig
	err := each(".", func(name string, data []byte) error {
		var c jetstream.StreamConfig
		if err := strictUnmarshal(data, &c); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		out = append(out, c)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// Consumer returns the consumer definition stored as consumers/<STREAM>.<name>.json.
func Consumer(stream, name string) (jetstream.ConsumerConfig, error) {
	var c jetstream.ConsumerConfig
	data, err := files.ReadFile(path.Join("consumers", stream+"."+name+".json"))
	if err != nil {
		return c, fmt.Errorf("consumer %s.%s: %w", stream, name, err)
	}
	if err := strictUnmarshal(data, &c); err != nil {
		return c, fmt.Errorf("consumer %s.%s: %w", stream, name, err)
	}
	return c, nil
}

// Buckets returns the KV bucket definitions.
func Buckets() ([]jetstream.KeyValueConfig, error) {
	var out []jetstream.KeyValueConfig
	err := each("kv", func(name string, data []byte) error {
		var c jetstream.KeyValueConfig
		if err := strictUnmarshal(data, &c); err != nil {
			return fmt.Errorf("bucket %s: %w", name, err)
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

func each(dir string, fn func(name string, data []byte) error) error {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := files.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		if err := fn(e.Name(), data); err != nil {
			return err
		}
	}
	return nil
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Ensure creates or updates every stream and bucket. It is idempotent: run it
// at every start, from any number of processes.
func Ensure(ctx context.Context, js jetstream.JetStream, opt Options) error {
	ss, err := Streams()
	if err != nil {
		return err
	}
	for _, c := range ss {
		if opt.Replicas > 0 {
			c.Replicas = opt.Replicas
		}
		if c.Name == Results && opt.ResultRetention > 0 {
			c.MaxAge = opt.ResultRetention
		}
		if _, err := js.CreateOrUpdateStream(ctx, c); err != nil {
			return fmt.Errorf("ensure stream %s: %w", c.Name, err)
		}
	}
	bs, err := Buckets()
	if err != nil {
		return err
	}
	for _, c := range bs {
		if opt.Replicas > 0 {
			c.Replicas = opt.Replicas
		}
		if c.TTL > 0 && opt.ResultRetention > 0 && c.Bucket != BucketBudgets {
			c.TTL = opt.ResultRetention
		}
		if _, err := js.CreateOrUpdateKeyValue(ctx, c); err != nil {
			return fmt.Errorf("ensure bucket %s: %w", c.Bucket, err)
		}
	}
	return nil
}

// EnsureConsumer creates or updates the durable consumer stored as
// consumers/<stream>.<template>.json, with name and filter overridden when
// given (the executor makes one per provider/model from one template).
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, stream, template, name, filter string) (jetstream.Consumer, error) {
	c, err := Consumer(stream, template)
	if err != nil {
		return nil, err
	}
	if name != "" {
		c.Durable = name
	}
	if filter != "" {
		c.FilterSubject = filter
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, c)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w", c.Durable, stream, err)
	}
	return cons, nil
}
