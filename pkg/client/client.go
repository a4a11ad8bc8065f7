// Package client is the Go client for Sluice over NATS: submit jobs, await
// their results, stream their answers as they are generated, or subscribe to
// a tenant's results. The job and result envelopes are package job's.
//
//	c, _ := client.New(nc)
//	res, err := c.Do(ctx, &job.Job{Tenant: "acme", Request: body})
//
// [Client.Stream] submits a streamed job and yields its chunks; [Follow]
// reads any job's stream by id, from its start, as the HTTP API's relay does.
// A submission waits through a NATS leader election (up to [ElectionWait]),
// offering the job again under the same id, so it never makes a second job.
//
// A submission Sluice cannot take now fails with an error that matches
// ErrQueueFull (errors.Is) and carries a suggested wait (errors.As
// *QueueFullError), which Sluice estimates from the jobs ahead and the
// model's rate.
//
// # Tenants
//
// A tenant connects as the NATS user named after it, with its API key as the
// password, and with its own reply inbox prefix: TenantUser sets both.
//
//	nc, _ := nats.Connect(url, client.TenantUser("acme", os.Getenv("ACME_SLUICE_KEY")))
//
// Such a connection may publish the tenant's jobs, ask for a wait hint and
// read the tenant's results as they are published, and nothing else: no
// JetStream API, no key-value bucket. So Do, Start and Subscribe work, while
// Await sees only results published after it subscribed, and Lookup is
// refused with ErrTenantConnection (the HTTP API's GET /v1/jobs/{id} reads
// stored results).
package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// ErrQueueFull matches a submission refused because Sluice's intake is full.
var ErrQueueFull = errors.New("sluice: queue full")

// QueueFullError is ErrQueueFull with a suggested wait before retrying.
type QueueFullError struct {
	RetryAfter time.Duration
	Err        error // the stream's refusal
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("sluice: queue full, retry after %s: %v", e.RetryAfter, e.Err)
}

func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }
func (e *QueueFullError) Unwrap() error        { return e.Err }

// DefaultRetryAfter is the suggested wait when no ingest process answers
// within HintTimeout.
const DefaultRetryAfter = 2 * time.Second

// HintTimeout bounds how long Submit, refused, asks Sluice for a suggested
// wait (sluice.ingest.wait.<tenant>).
const HintTimeout = 250 * time.Millisecond

// hintTTL is how long a suggested wait is reused for the same tenant and
// model: a producer refused many times a second asks once.
const hintTTL = time.Second

// InboxPrefix is the reply inbox prefix of a tenant's connections: the
// tenant's NATS user may read replies under it and nowhere else.
func InboxPrefix(tenant string) string { return "_INBOX_" + tenant }

// TenantUser is the nats.Option that connects as a tenant: user tenant,
// password its Sluice API key, and the tenant's reply inbox prefix.
func TenantUser(tenant, apiKey string) nats.Option {
	return func(o *nats.Options) error {
		if err := nats.UserInfo(tenant, apiKey)(o); err != nil {
			return err
		}
		return nats.CustomInboxPrefix(InboxPrefix(tenant))(o)
	}
}

// ErrTenantConnection is returned by Lookup on a tenant's connection, which
// may not read JetStream.
var ErrTenantConnection = errors.New("sluice: a tenant's NATS connection cannot read stored results; use Do or Start, or GET /v1/jobs/{id} over HTTP")

// Client talks to Sluice over one NATS connection.
type Client struct {
	nc *nats.Conn
	js jetstream.JetStream
	// tenant is set on a tenant's connection (TenantUser): JetStream reads
	// are not permitted there, so they are not tried.
	tenant string
	// secret keys the message ids of this client's submissions
	// (job.IntakeMsgID): no other tenant can compute them.
	secret []byte

	mu    sync.Mutex
	hints map[string]hint // tenant + model -> last suggested wait
}

type hint struct {
	wait time.Duration
	at   time.Time
}

// New makes a client on an open connection.
func New(nc *nats.Conn) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c := &Client{nc: nc, js: js, secret: make([]byte, 32), hints: map[string]hint{}}
	_, _ = rand.Read(c.secret) // never fails
	if p, ok := strings.CutPrefix(nc.Opts.InboxPrefix, InboxPrefix("")); ok && job.ValidName(p) {
		c.tenant = p
	}
	return c, nil
}

// Submit publishes a job to sluice.intake.<tenant> and returns its id (one is
// assigned when j.ID is empty). The JetStream acknowledgement means the job is
// durably accepted. A repeat of the same job (tenant, id and envelope) through
// the same Client within two minutes is dropped by the stream and reported as
// a *DuplicateError (errors.Is ErrDuplicate), so retrying a Submit is safe
// and visible; through another Client, ingest recognizes the tenant's job
// id and the job still runs once.
func (c *Client) Submit(ctx context.Context, j *job.Job) (string, error) {
	if err := checkRef(j.Tenant, ""); err != nil {
		return "", err
	}
	if j.ID == "" {
		j.ID = job.NewID()
	}
	data, err := json.Marshal(j)
	if err != nil {
		return "", err
	}
	msg := nats.NewMsg(job.IntakeSubject(j.Tenant))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, job.IntakeMsgID(c.secret, j.Tenant, j.ID, msg.Data))
	ack, err := c.publish(ctx, msg)
	if err != nil {
		if isFull(err) {
			return "", &QueueFullError{RetryAfter: c.retryAfter(ctx, j, data), Err: err}
		}
		return "", fmt.Errorf("sluice: submit: %w", err)
	}
	if ack.Duplicate {
		return j.ID, &DuplicateError{ID: j.ID}
	}
	return j.ID, nil
}

// ErrDuplicate matches a submission INTAKE dropped because the same job (the
// tenant, id and envelope) was published within its duplicate window: the
// job is not submitted a second time.
var ErrDuplicate = errors.New("sluice: duplicate submission")

// DuplicateError is ErrDuplicate for job ID. The first submission stands;
// its result arrives on the job's result subject as usual.
type DuplicateError struct{ ID string }

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("sluice: job %s was already submitted within the duplicate window; not submitted again", e.ID)
}

func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// retryAfter asks ingest how long to wait before offering j (encoded as
// data) again, waiting at most HintTimeout; DefaultRetryAfter when nobody
// answers.
func (c *Client) retryAfter(ctx context.Context, j *job.Job, data []byte) time.Duration {
	var req struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(j.Request, &req)
	key := j.Tenant + "\x00" + req.Model
	c.mu.Lock()
	h, ok := c.hints[key]
	c.mu.Unlock()
	if ok && time.Since(h.at) < hintTTL {
		return h.wait
	}
	ctx, cancel := context.WithTimeout(ctx, HintTimeout)
	defer cancel()
	wait := DefaultRetryAfter
	if m, err := c.nc.RequestWithContext(ctx, job.WaitSubject(j.Tenant), data); err == nil {
		var wh job.WaitHint
		if json.Unmarshal(m.Data, &wh) == nil && wh.RetryAfterMS > 0 {
			wait = time.Duration(wh.RetryAfterMS) * time.Millisecond
			c.mu.Lock()
			if len(c.hints) > 1000 {
				clear(c.hints)
			}
			c.hints[key] = hint{wait: wait, at: time.Now()}
			c.mu.Unlock()
		}
	}
	return wait
}

func isFull(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == 10077
	}
	return false
}

// Await waits for the job's terminal result.
func (c *Client) Await(ctx context.Context, tenant, id string) (*job.Result, error) {
	if err := checkRef(tenant, id); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, ErrInvalidID
	}
	var stored func(context.Context) (*job.Result, error)
	if c.tenant == "" {
		// A tenant connection may not read RESULTS or the results bucket.
		stored = func(ctx context.Context) (*job.Result, error) {
			if r, err := storedResult(ctx, c.js, tenant, id); err == nil {
				return r, nil
			}
			if r, err := c.Lookup(ctx, tenant, id); err == nil && r != nil {
				return r, nil
			}
			return nil, nil
		}
	}
	return WaitResult(ctx, c.nc, tenant, id, stored)
}

// WaitResult is the one way to wait for a job's result, which Await and
// Sluice's own HTTP API share: subscribe to the job's result subject
// first, then ask stored (when not nil) for a result published before the
// subscription (nil, nil: none yet; an error ends the wait), and
// otherwise wait for the publication or the end of ctx. RESULTS stores a
// result before it is republished to the subscribers, so a result is
// either stored by the time stored looks or still to come.
func WaitResult(ctx context.Context, nc *nats.Conn, tenant, id string, stored func(context.Context) (*job.Result, error)) (*job.Result, error) {
	ch := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe(job.ResultSubject(tenant, id), ch)
	if err != nil {
		return nil, fmt.Errorf("sluice: subscribe result: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if stored != nil {
		if r, err := stored(ctx); err != nil || r != nil {
			return r, err
		}
	}
	return waitResult(ctx, id, ch)
}

func waitResult(ctx context.Context, id string, ch <-chan *nats.Msg) (*job.Result, error) {
	select {
	case m := <-ch:
		var r job.Result
		if err := jsonv1.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("sluice: result %s: %w", id, err)
		}
		return &r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Lookup returns tenant's job's result if it has one (nil, nil while
// pending). Job ids are unique within a tenant: another tenant's job with
// the same id is not this one.
func (c *Client) Lookup(ctx context.Context, tenant, id string) (*job.Result, error) {
	if c.tenant != "" {
		return nil, ErrTenantConnection
	}
	if err := checkRef(tenant, id); err != nil {
		return nil, err
	}
	if !job.CanonicalID(id) {
		return nil, ErrInvalidID
	}
	kv, err := c.js.KeyValue(ctx, streams.BucketResults)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, job.KeyOf(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// A record written before ids were scoped by tenant.
		e, err = kv.Get(ctx, id)
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, job.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var rec struct {
		Tenant string      `json:"tenant"`
		Result *job.Result `json:"result"`
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, err
	}
	if rec.Tenant != tenant {
		return nil, job.ErrNotFound
	}
	return rec.Result, nil
}

// Do submits a job and waits for its result.
func (c *Client) Do(ctx context.Context, j *job.Job) (*job.Result, error) {
	p, err := c.Start(ctx, j)
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	return p.Wait(ctx)
}

// Pending is a submitted job whose result subject is being watched.
type Pending struct {
	ID  string
	sub *nats.Subscription
	ch  chan *nats.Msg
}

// Start subscribes to the job's result subject, then submits it: the
// result cannot be missed, and no JetStream read is needed (so it works on
// a tenant's connection). Wait for the result with Wait; Stop when done.
func (c *Client) Start(ctx context.Context, j *job.Job) (*Pending, error) {
	if err := checkRef(j.Tenant, j.ID); err != nil {
		return nil, err
	}
	if j.ID == "" {
		j.ID = job.NewID()
	}
	p := &Pending{ID: j.ID, ch: make(chan *nats.Msg, 1)}
	sub, err := c.nc.ChanSubscribe(job.ResultSubject(j.Tenant, j.ID), p.ch)
	if err != nil {
		return nil, fmt.Errorf("sluice: subscribe result: %w", err)
	}
	p.sub = sub
	if _, err := c.Submit(ctx, j); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// Wait returns the job's result, or ctx's error.
func (p *Pending) Wait(ctx context.Context) (*job.Result, error) { return waitResult(ctx, p.ID, p.ch) }

// Stop ends the watch.
func (p *Pending) Stop() { _ = p.sub.Unsubscribe() }

// Subscribe calls fn with every result of tenant as it is stored. Results
// are published once per job; a subscriber that is not connected at the time
// misses it and can Lookup the job instead.
func (c *Client) Subscribe(tenant string, fn func(*job.Result)) (*nats.Subscription, error) {
	if err := checkRef(tenant, ""); err != nil {
		return nil, err
	}
	return c.nc.Subscribe(job.ResultPrefix+tenant+".>", func(m *nats.Msg) {
		var r job.Result
		if err := jsonv1.Unmarshal(m.Data, &r); err == nil {
			fn(&r)
		}
	})
}
