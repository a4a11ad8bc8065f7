// Package streams holds Sluice's JetStream objects as JSON (the format
// `nats stream add --config`, `nats consumer add --config` and
// `nats kv add` read), embedded in the binary, and creates or updates them.
package streams

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
)

//go:embed *.json consumers/*.json kv/*.json obj/*.json
var files embed.FS

// Names of the objects.
const (
	Intake       = "INTAKE"
	Queue        = "QUEUE"
	Dispatch     = "DISPATCH"
	Results      = "RESULTS"
	DLQ          = "DLQ"
	StreamChunks = "STREAMS" // chunks of streamed answers (memory, minutes)
	Lane         = "LANE"    // jobs of the batch lane (services/lane)

	BucketBudgets     = "budgets"
	BucketIdempotency = "idempotency"
	BucketResults     = "results"
	// BucketCache holds cached answers (internal/cache).
	BucketCache = "cache"
	// BucketFleet holds the fleet key: only the operator identity writes
	// it, so no service role (nor anyone it can be made to publish for)
	// can change it.
	BucketFleet = "fleet"
	// BucketBatches holds callers' file and batch records, and
	// ObjectFiles their files' contents (services/batches): kept for
	// their own TTL, not the results' retention.
	BucketBatches = "batches"
	ObjectFiles   = "files"
)

// Options adjust the embedded definitions at start.
type Options struct {
	Replicas        int           // 0 keeps the file's value
	ResultRetention time.Duration // RESULTS max_age and results/idempotency TTL; 0 keeps the files'
	DLQRetention    time.Duration // DLQ max_age; 0 keeps the file's
	StreamReplay    time.Duration // STREAMS max_age; 0 keeps the file's
	Intake, Queue   Bounds        // INTAKE's and QUEUE's limits
	// JobMsgBytes and ResultMsgBytes set max_msg_size: of the streams
	// that carry jobs (INTAKE, QUEUE, DISPATCH, DLQ) and of RESULTS.
	// 0 keeps the files' values.
	JobMsgBytes, ResultMsgBytes int32
	// CacheBytes bounds the cache bucket; 0 keeps the file's value.
	CacheBytes int64
	// Log, when set, says what Ensure changed beyond the definitions
	// (a consumer of an older Sluice it removed).
	Log *slog.Logger
}

// Bounds are the limits of a bounded stream; a zero field keeps the file's
// value. Both bounded streams discard new messages, per subject too: a full
// stream refuses a publish (error 10077) and never drops what it holds.
type Bounds struct {
	MaxMsgs           int64
	MaxBytes          int64
	MaxMsgsPerSubject int64 // INTAKE: per tenant; QUEUE: per priority and tenant
}

func (b Bounds) apply(c *jetstream.StreamConfig) {
	if b.MaxMsgs > 0 {
		c.MaxMsgs = b.MaxMsgs
	}
	if b.MaxBytes > 0 {
		c.MaxBytes = b.MaxBytes
	}
	if b.MaxMsgsPerSubject > 0 {
		c.MaxMsgsPerSubject = b.MaxMsgsPerSubject
	}
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

// ObjectStores returns the object store definitions.
func ObjectStores() ([]jetstream.ObjectStoreConfig, error) {
	var out []jetstream.ObjectStoreConfig
	err := each("obj", func(name string, data []byte) error {
		var c jetstream.ObjectStoreConfig
		if err := strictUnmarshal(data, &c); err != nil {
			return fmt.Errorf("object store %s: %w", name, err)
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

// ensureObjectStore creates or updates an object store.
func ensureObjectStore(ctx context.Context, js jetstream.JetStream, c jetstream.ObjectStoreConfig) error {
	if _, err := js.CreateOrUpdateObjectStore(ctx, c); err != nil {
		return fmt.Errorf("ensure object store %s: %w", c.Bucket, err)
	}
	return nil
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

// Ensure creates or updates every stream and bucket, and removes QUEUE's
// fleet-wide admission consumer of an older Sluice (FleetAdmission). It is
// idempotent: run it at every start, from any number of processes.
//
// The objects are made concurrently. On a forming cluster every node runs
// Ensure at once, and a create whose twin from another node won the race
// may never be answered: made one after another, each object would cost an
// attempt's timeout (about a minute for the lot on three nodes); made
// together, they cost one.
func Ensure(ctx context.Context, js jetstream.JetStream, opt Options) error {
	ss, err := Streams()
	if err != nil {
		return err
	}
	bs, err := Buckets()
	if err != nil {
		return err
	}
	var jobs []func() error
	for _, c := range ss {
		if opt.Replicas > 0 {
			c.Replicas = opt.Replicas
		}
		if c.Name == Results && opt.ResultRetention > 0 {
			c.MaxAge = opt.ResultRetention
		}
		if c.Name == DLQ && opt.DLQRetention > 0 {
			c.MaxAge = opt.DLQRetention
		}
		if c.Name == StreamChunks && opt.StreamReplay > 0 {
			c.MaxAge = opt.StreamReplay
		}
		switch c.Name {
		case Intake:
			opt.Intake.apply(&c)
		case Queue:
			opt.Queue.apply(&c)
		}
		switch {
		case c.Name == Results && opt.ResultMsgBytes > 0:
			c.MaxMsgSize = opt.ResultMsgBytes
		case c.Name != Results && c.Name != StreamChunks && opt.JobMsgBytes > 0:
			c.MaxMsgSize = opt.JobMsgBytes
		}
		jobs = append(jobs, func() error {
			if err := checkPerSubject(ctx, js, c); err != nil {
				return raced(err)
			}
			// An unchanged stream is not updated: every node ensures the
			// streams as it starts, and an update beside another node's
			// consumer creation races inside the server.
			if st, err := js.Stream(ctx, c.Name); err == nil && sameStreamSettings(st.CachedInfo().Config, c) {
				return nil
			}
			if _, err := js.CreateOrUpdateStream(ctx, c); err != nil {
				return raced(fmt.Errorf("ensure stream %s: %w", c.Name, err))
			}
			return nil
		})
	}
	for _, c := range bs {
		if opt.Replicas > 0 {
			c.Replicas = opt.Replicas
		}
		if c.TTL > 0 && opt.ResultRetention > 0 && c.Bucket != BucketBudgets && c.Bucket != BucketBatches {
			c.TTL = opt.ResultRetention
		}
		if c.Bucket == BucketCache && opt.CacheBytes > 0 {
			c.MaxBytes = opt.CacheBytes
		}
		jobs = append(jobs, func() error { return raced(ensureBucket(ctx, js, c)) })
	}
	objs, err := ObjectStores()
	if err != nil {
		return err
	}
	for _, c := range objs {
		if opt.Replicas > 0 {
			c.Replicas = opt.Replicas
		}
		jobs = append(jobs, func() error { return raced(ensureObjectStore(ctx, js, c)) })
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, fn := range jobs {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	// A lasting error first (a caller retries transient ones, and would
	// retry a lasting one hidden behind them until its deadline).
	var transient error
	for _, err := range errs {
		switch {
		case err == nil:
		case !IsTransient(err):
			return err
		case transient == nil:
			transient = err
		}
	}
	if transient != nil {
		return transient
	}
	return raced(retireFleetAdmission(ctx, js, opt.Log))
}

// FleetAdmission is the QUEUE consumer that an older Sluice's admission
// processes shared for every tenant. On a work queue it overlaps each
// tenant's consumer (error 10100), and its one max_ack_pending let one
// tenant's waiting jobs take the window of all.
const FleetAdmission = "admission"

// retireFleetAdmission removes FleetAdmission when it takes jobs (the
// template loaded by `nats consumer add` takes none). Nothing is lost: on
// a work queue a message leaves only when acknowledged, so the jobs it
// had delivered go to their tenants' consumers; one an older process
// dispatched meanwhile is dropped by DISPATCH's duplicate window (its
// message id names its QUEUE sequence).
func retireFleetAdmission(ctx context.Context, js jetstream.JetStream, log *slog.Logger) error {
	cons, err := js.Consumer(ctx, Queue, FleetAdmission)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up consumer %s on %s: %w", FleetAdmission, Queue, err)
	}
	info := cons.CachedInfo()
	if !slices.ContainsFunc(filters(info.Config), func(f string) bool { return subjectsCollide(f, job.QueuePrefix+"*.*") }) {
		return nil
	}
	err = js.DeleteConsumer(ctx, Queue, FleetAdmission)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil // another process removed it
	}
	if err != nil {
		return fmt.Errorf("remove the fleet-wide consumer %s on %s: %w", FleetAdmission, Queue, err)
	}
	if log != nil {
		log.Info("removed QUEUE's fleet-wide admission consumer of an older Sluice; each tenant has its own now",
			"consumer", FleetAdmission, "jobs_it_held", info.NumAckPending)
	}
	return nil
}

// checkPerSubject refuses to lower a stream's max_msgs_per_subject below
// what one of its subjects holds: JetStream enforces a lowered per-subject
// limit by deleting the oldest messages, whatever the discard policy, and
// in INTAKE and QUEUE those are accepted jobs. (A publish landing between
// this check and the update could still exceed the new limit; lower the
// bound while the stream is quiet.)
func checkPerSubject(ctx context.Context, js jetstream.JetStream, c jetstream.StreamConfig) error {
	if c.MaxMsgsPerSubject <= 0 {
		return nil
	}
	st, err := js.Stream(ctx, c.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", c.Name, err)
	}
	cur := st.CachedInfo()
	if old := cur.Config.MaxMsgsPerSubject; (old > 0 && old <= c.MaxMsgsPerSubject) || cur.State.Msgs <= uint64(c.MaxMsgsPerSubject) {
		return nil
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", c.Name, err)
	}
	var most string
	for subj, n := range info.State.Subjects {
		if n > info.State.Subjects[most] || (n == info.State.Subjects[most] && subj < most) {
			most = subj
		}
	}
	if n := info.State.Subjects[most]; n > uint64(c.MaxMsgsPerSubject) {
		return fmt.Errorf("ensure stream %s: max_msgs_per_subject %d is below the %d messages %s holds, and lowering it would delete the oldest of them; raise the bound, or lower it once the backlog has drained",
			c.Name, c.MaxMsgsPerSubject, n, most)
	}
	return nil
}

// Durable is a durable consumer made from the template stored as
// consumers/<Stream>.<Template>.json, with what is set here overriding
// the file (the executor makes one per provider/model from one template,
// admission one per tenant).
type Durable struct {
	Stream, Template string
	Name, Filter     string // "": the file's
	MaxAckPending    int    // 0: the file's
}

// EnsureConsumer is EnsureDurable with name and filter overridden when
// given.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, stream, template, name, filter string) (jetstream.Consumer, error) {
	return EnsureDurable(ctx, js, Durable{Stream: stream, Template: template, Name: name, Filter: filter})
}

// EnsureDurable creates or updates the durable consumer d.
func EnsureDurable(ctx context.Context, js jetstream.JetStream, d Durable) (jetstream.Consumer, error) {
	stream := d.Stream
	c, err := Consumer(stream, d.Template)
	if err != nil {
		return nil, err
	}
	if d.Name != "" {
		c.Durable = d.Name
	}
	if d.Filter != "" {
		c.FilterSubject = d.Filter
	}
	if d.MaxAckPending > 0 {
		c.MaxAckPending = d.MaxAckPending
	}
	// A leader election (a node lost, a cluster forming) is ridden out
	// for up to a minute; a consumer that cannot be made is then an error.
	var cons jetstream.Consumer
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = Retry(rctx, func(ctx context.Context) (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, stream, c)
		return err
	})
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errConsumerNotUnique {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w%s", c.Durable, stream, err, overlapping(ctx, js, stream, c))
	}
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w", c.Durable, stream, err)
	}
	return cons, nil
}

// errConsumerNotUnique is JetStream's "filtered consumer not unique on
// workqueue stream": on a work queue each subject belongs to one consumer.
const errConsumerNotUnique = 10100

// overlapping names the consumers of stream whose filters overlap c's, and
// how to remove them.
func overlapping(ctx context.Context, js jetstream.JetStream, stream string, c jetstream.ConsumerConfig) string {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return ""
	}
	mine := filters(c)
	var out []string
	lister := st.ListConsumers(ctx)
	for info := range lister.Info() {
		if info.Name == c.Durable {
			continue
		}
		theirs := filters(info.Config)
		for _, a := range mine {
			if slices.ContainsFunc(theirs, func(b string) bool { return subjectsCollide(a, b) }) {
				out = append(out, fmt.Sprintf("; consumer %q (filter %q) already takes these subjects: if Sluice does not use it (an older Sluice's fleet-wide admission consumer on QUEUE, or its executor template without a filter loaded by `nats consumer add`, for instance), remove it with `nats consumer rm %s %s`",
					info.Name, strings.Join(theirs, ","), stream, info.Name))
				break
			}
		}
	}
	return strings.Join(out, "")
}

// filters returns a consumer's filter subjects; none means all (">").
func filters(c jetstream.ConsumerConfig) []string {
	fs := slices.Clone(c.FilterSubjects)
	if c.FilterSubject != "" {
		fs = append(fs, c.FilterSubject)
	}
	if len(fs) == 0 {
		fs = []string{">"}
	}
	return fs
}

// subjectsCollide reports whether some subject matches both filters.
func subjectsCollide(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(at) && i < len(bt); i++ {
		switch {
		case at[i] == ">" || bt[i] == ">":
			return true
		case at[i] == "*" || bt[i] == "*" || at[i] == bt[i]:
		default:
			return false
		}
	}
	return len(at) == len(bt)
}

// sameStreamSettings reports whether a stream's configuration already has
// every member want sets, as want sets it (members only the server
// fills, such as its metadata, are not compared).
func sameStreamSettings(cur, want jetstream.StreamConfig) bool {
	var c, w map[string]json.RawMessage
	cj, err1 := json.Marshal(cur)
	wj, err2 := json.Marshal(want)
	if err1 != nil || err2 != nil || json.Unmarshal(cj, &c) != nil || json.Unmarshal(wj, &w) != nil {
		return false
	}
	for k, v := range w {
		if !bytes.Equal(c[k], v) {
			return false
		}
	}
	return true
}
