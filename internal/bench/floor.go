package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Floor is the throughput of a pipeline that makes, per job, the JetStream
// operations Sluice makes and nothing else: no validation, no token
// estimate, no budget, no signatures, no JSON (the payloads are opaque
// bytes of the sizes of the overhead benchmark's messages; revisions ride
// in headers). It runs on Sluice's own streams, consumers and buckets
// (streams.Ensure), with the services' consumer settings and concurrency,
// on a fresh embedded server: what is left between Sluice and its floor is
// Sluice's own work.
type Floor struct {
	// OneRecord: the job's record also serves as its operation record (one
	// record create and two updates per job, not two creates and three
	// updates): what merging the two records would leave.
	OneRecord bool `json:"one_record"`
	// Call: the executor stage also calls the provider (the same zero-latency
	// simulator, over loopback HTTP), as Sluice's executor does.
	Call        bool    `json:"provider_call"`
	Jobs        int     `json:"jobs"`
	JobsPerSec  float64 `json:"jobs_per_s"`
	CPUPerJobMS float64 `json:"cpu_per_job_ms"`
}

// The payload sizes of the overhead benchmark's job, stage by stage (read
// off the wire): intake envelope, job record, operation record, queued and
// dispatched envelopes, the in-flight operation record, the result, the
// terminal job record and the settled operation record.
const (
	floorIntake, floorRecord, floorOp         = 206, 132, 217
	floorQueued, floorDispatched, floorFlight = 425, 632, 232
	floorResult, floorTerminal, floorSettled  = 998, 1143, 373
)

// MeasureFloor runs jobs through the floor pipeline from conc producers
// (open loop, as the overhead benchmark's loaded test), over one loopback
// TCP connection for the producers and one in-process connection for the
// stages, and reports its throughput. providerURL is the simulator's base
// URL ("" for no provider call).
func MeasureFloor(ctx context.Context, jobs, conc int, providerURL string, oneRecord bool) (Floor, error) {
	f := Floor{OneRecord: oneRecord, Call: providerURL != "", Jobs: jobs}
	ns, stop, err := freshServer("sluice-floor-")
	if err != nil {
		return f, err
	}
	defer stop()
	svc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		return f, err
	}
	defer svc.Close()
	js, err := jetstream.New(svc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return f, err
	}
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		return f, err
	}
	records, err := js.KeyValue(ctx, streams.BucketResults)
	if err != nil {
		return f, err
	}
	ops, err := js.KeyValue(ctx, streams.BucketIdempotency)
	if err != nil {
		return f, err
	}
	pl := &floorPipeline{js: js, records: records, ops: ops, oneRecord: oneRecord, providerURL: providerURL,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * conc}, Timeout: time.Minute},
		done: make(chan struct{}), errc: make(chan struct{}), want: int64(jobs),
		payload: bytes.Repeat([]byte{'x'}, max(floorIntake, floorRecord, floorOp, floorQueued, floorDispatched, floorFlight, floorResult, floorTerminal, floorSettled))}

	prod, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return f, err
	}
	defer prod.Close()
	pjs, err := jetstream.New(prod)
	if err != nil {
		return f, err
	}
	sub, err := prod.Subscribe(job.ResultPrefix+">", func(*nats.Msg) {
		if pl.finished.Add(1) == pl.want {
			close(pl.done)
		}
	})
	if err != nil {
		return f, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := prod.Flush(); err != nil {
		return f, err
	}
	stopStages, err := pl.start(ctx)
	defer stopStages()
	if err != nil {
		return f, err
	}

	ids := make(chan string, jobs)
	for range jobs {
		ids <- job.NewID()
	}
	close(ids)
	cpu0 := processCPU()
	began := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				m := nats.NewMsg(job.IntakeSubject(floorTenant))
				m.Data = pl.data(floorIntake)
				m.Header.Set(jetstream.MsgIDHeader, job.IntakeMsgID(nil, floorTenant, id, m.Data))
				m.Header.Set(floorID, id)
				if _, err := pjs.PublishMsg(ctx, m); err != nil {
					pl.fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-pl.done:
	case <-pl.errc:
		return f, pl.err()
	case <-ctx.Done():
		return f, fmt.Errorf("floor: %d of %d jobs finished: %w", pl.finished.Load(), jobs, ctx.Err())
	}
	wall := time.Since(began)
	f.JobsPerSec = float64(jobs) / wall.Seconds()
	if cpu := processCPU() - cpu0; cpu > 0 {
		f.CPUPerJobMS = ms64(cpu) / float64(jobs)
	}
	return f, pl.err()
}

const (
	floorTenant = "bench"
	floorModel  = "gpt-4o-mini"
	// Headers carrying what the services carry in their envelopes.
	floorID, floorRecRev, floorOpRev = "Floor-Id", "Floor-Rec-Rev", "Floor-Op-Rev"
)

type floorPipeline struct {
	js          jetstream.JetStream
	records     jetstream.KeyValue
	ops         jetstream.KeyValue
	oneRecord   bool
	providerURL string
	http        *http.Client
	payload     []byte
	want        int64
	finished    atomic.Int64
	done        chan struct{} // closed when want results arrived

	mu    sync.Mutex
	first error
	errc  chan struct{} // closed with the first error
}

func (p *floorPipeline) data(n int) []byte { return p.payload[:n] }

func (p *floorPipeline) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first == nil {
		p.first = err
		close(p.errc)
	}
}

func (p *floorPipeline) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

func rev(h nats.Header, key string) uint64 {
	v, _ := strconv.ParseUint(h.Get(key), 10, 64)
	return v
}

// start runs the four stages (ingest, admit, execute, settle); stop ends
// them.
func (p *floorPipeline) start(ctx context.Context) (stop func(), err error) {
	var ccs []jetstream.ConsumeContext
	stop = func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}
	consume := func(stream, template, name, filter string, batch int, h jetstream.MessageHandler) error {
		c, err := streams.EnsureConsumer(ctx, p.js, stream, template, name, filter)
		if err != nil {
			return err
		}
		cc, err := c.Consume(h, jetstream.PullMaxMessages(batch))
		if err != nil {
			return err
		}
		ccs = append(ccs, cc)
		return nil
	}
	// ingest: up to 32 jobs at once.
	sem := make(chan struct{}, 32)
	if err := consume(streams.Intake, "ingest", "ingest", "", 512, func(m jetstream.Msg) {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			p.ingest(ctx, m)
		}()
	}); err != nil {
		return stop, err
	}
	in := make(chan jetstream.Msg, 1024)
	// One consumer over every tenant's jobs: the floor measures the
	// pipeline's hops, not admission's per-tenant windows.
	if err := consume(streams.Queue, "admission", "floor-admission", job.QueuePrefix+">", 256, func(m jetstream.Msg) { in <- m }); err != nil {
		return stop, err
	}
	loopCtx, cancel := context.WithCancel(ctx)
	prev := stop
	stop = func() { prev(); cancel() }
	go p.admit(loopCtx, in)
	// executor: each job on its own goroutine.
	if err := consume(streams.Dispatch, "executor", "executor-sim-"+job.ModelToken(floorModel), job.DispatchSubject("sim", floorModel), 256, func(m jetstream.Msg) {
		go p.execute(ctx, m)
	}); err != nil {
		return stop, err
	}
	if err := consume(streams.Results, "result", "result", "", 256, func(m jetstream.Msg) { p.settle(ctx, m) }); err != nil {
		return stop, err
	}
	return stop, nil
}

// ingest writes a job's records at once, then puts it on QUEUE.
func (p *floorPipeline) ingest(ctx context.Context, m jetstream.Msg) {
	id := m.Headers().Get(floorID)
	var opRev uint64
	var opErr error
	var wg sync.WaitGroup
	if !p.oneRecord {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opRev, opErr = p.ops.Create(ctx, floorTenant+"."+id, p.data(floorOp))
		}()
	}
	recRev, err := p.records.Create(ctx, keys.Record(floorTenant, id), p.data(floorRecord))
	wg.Wait()
	if err = errors.Join(err, opErr); err != nil {
		p.fail(fmt.Errorf("ingest: %w", err))
		return
	}
	q := nats.NewMsg(job.QueueSubject(job.Interactive, floorTenant))
	q.Data = p.data(floorQueued)
	q.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgQueued, floorTenant, id, ""))
	q.Header.Set(floorID, id)
	q.Header.Set(floorRecRev, strconv.FormatUint(recRev, 10))
	q.Header.Set(floorOpRev, strconv.FormatUint(opRev, 10))
	if _, err := p.js.PublishMsg(ctx, q); err != nil {
		p.fail(fmt.Errorf("ingest: %w", err))
		return
	}
	_ = m.Ack()
}

// admit is admission's one loop: batches of what has arrived, published
// asynchronously; each QUEUE message acknowledged after its dispatch.
func (p *floorPipeline) admit(ctx context.Context, in <-chan jetstream.Msg) {
	var batch []jetstream.Msg
	var futs []jetstream.PubAckFuture
	for {
		select {
		case m := <-in:
			batch = append(batch[:0], m)
		case <-ctx.Done():
			return
		}
	drain:
		for len(batch) < 64 {
			select {
			case m := <-in:
				batch = append(batch, m)
			default:
				break drain
			}
		}
		futs = futs[:0]
		for _, m := range batch {
			d := nats.NewMsg(job.DispatchSubject("sim", floorModel))
			d.Data = p.data(floorDispatched)
			d.Header = m.Headers()
			d.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgDispatch, floorTenant, m.Headers().Get(floorID), ""))
			fut, err := p.js.PublishMsgAsync(d)
			if err != nil {
				p.fail(fmt.Errorf("admission: %w", err))
				return
			}
			futs = append(futs, fut)
		}
		for i, fut := range futs {
			select {
			case <-fut.Ok():
				_ = batch[i].Ack()
			case err := <-fut.Err():
				p.fail(fmt.Errorf("admission: %w", err))
				return
			}
		}
	}
}

// execute marks the operation in flight, makes the call and publishes the
// result.
func (p *floorPipeline) execute(ctx context.Context, m jetstream.Msg) {
	h := m.Headers()
	id := h.Get(floorID)
	var opRev uint64
	var err error
	if p.oneRecord {
		opRev, err = p.records.Update(ctx, keys.Record(floorTenant, id), p.data(floorFlight), rev(h, floorRecRev))
	} else {
		opRev, err = p.ops.Update(ctx, floorTenant+"."+id, p.data(floorFlight), rev(h, floorOpRev))
	}
	if err == nil && p.providerURL != "" {
		err = p.call(ctx, id)
	}
	if err != nil {
		p.fail(fmt.Errorf("executor: %w", err))
		return
	}
	r := nats.NewMsg(job.StoreSubject(floorTenant, id))
	r.Data = p.data(floorResult)
	r.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgResult, floorTenant, id, ""))
	r.Header.Set(floorID, id)
	r.Header.Set(floorRecRev, h.Get(floorRecRev))
	r.Header.Set(floorOpRev, strconv.FormatUint(opRev, 10))
	if _, err := p.js.PublishMsg(ctx, r); err != nil {
		p.fail(fmt.Errorf("executor: %w", err))
		return
	}
	_ = m.Ack()
}

// settle writes the terminal record and settles the operation.
func (p *floorPipeline) settle(ctx context.Context, m jetstream.Msg) {
	h := m.Headers()
	id := h.Get(floorID)
	var err error
	if p.oneRecord {
		_, err = p.records.Update(ctx, keys.Record(floorTenant, id), p.data(floorTerminal), rev(h, floorOpRev))
	} else {
		_, err = p.records.Update(ctx, keys.Record(floorTenant, id), p.data(floorTerminal), rev(h, floorRecRev))
		if err == nil {
			_, err = p.ops.Update(ctx, floorTenant+"."+id, p.data(floorSettled), rev(h, floorOpRev))
		}
	}
	if err != nil {
		p.fail(fmt.Errorf("result: %w", err))
		return
	}
	_ = m.Ack()
}

// call sends the overhead benchmark's request to the provider, as the
// executor does (without its client's classification and metering), with
// the headers the executor sends (provider.Call): the simulator does the
// same work for both, an Idempotency-Key running the call through its
// ledger.
func (p *floorPipeline) call(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.providerURL+"/chat/completions", bytes.NewReader(overheadBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sluice")
	req.Header.Set("Authorization", "Bearer floor")
	req.Header.Set("Idempotency-Key", "floor-"+id)
	req.Header.Set("X-Sluice-Job-Id", id)
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("provider: HTTP %d", resp.StatusCode)
	}
	return nil
}
