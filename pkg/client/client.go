// Package client is the Go client for Sluice over NATS: submit jobs, await
// their results, or subscribe to a tenant's results.
//
//	c, _ := client.New(nc)
//	res, err := c.Do(ctx, &job.Job{Tenant: "acme", Request: body})
//
// A submission Sluice cannot take now fails with an error that matches
// ErrQueueFull (errors.Is) and carries a suggested wait (errors.As
// *QueueFullError), which Sluice estimates from the jobs ahead and the
// model's rate.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
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

// Client talks to Sluice over one NATS connection.
type Client struct {
	nc *nats.Conn
	js jetstream.JetStream

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
	return &Client{nc: nc, js: js, hints: map[string]hint{}}, nil
}

// Submit publishes a job to sluice.intake.<tenant> and returns its id (one is
// assigned when j.ID is empty). The JetStream acknowledgement means the job is
// durably accepted; a repeat of the same id within two minutes is dropped by
// the stream, so retrying a Submit is safe.
func (c *Client) Submit(ctx context.Context, j *job.Job) (string, error) {
	if !job.ValidName(j.Tenant) {
		return "", fmt.Errorf("sluice: tenant %q is not a valid name", j.Tenant)
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
	msg.Header.Set(jetstream.MsgIDHeader, "intake:"+j.ID)
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		if isFull(err) {
			return "", &QueueFullError{RetryAfter: c.retryAfter(ctx, j, data), Err: err}
		}
		return "", fmt.Errorf("sluice: submit: %w", err)
	}
	return j.ID, nil
}

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
	ch := make(chan *nats.Msg, 1)
	sub, err := c.nc.ChanSubscribe(job.ResultSubject(tenant, id), ch)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The result may have been stored before we subscribed: RESULTS holds it
	// from the moment it was published.
	if st, err := c.js.Stream(ctx, "RESULTS"); err == nil {
		if m, err := st.GetLastMsgForSubject(ctx, job.StoreSubject(tenant, id)); err == nil {
			var r job.Result
			if err := json.Unmarshal(m.Data, &r); err == nil {
				return &r, nil
			}
		}
	}
	if r, err := c.Lookup(ctx, id); err == nil && r != nil {
		return r, nil
	}
	select {
	case m := <-ch:
		var r job.Result
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("sluice: result %s: %w", id, err)
		}
		return &r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Lookup returns the job's result if it has one (nil, nil while pending).
func (c *Client) Lookup(ctx context.Context, id string) (*job.Result, error) {
	kv, err := c.js.KeyValue(ctx, "results")
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, job.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var rec struct {
		Result *job.Result `json:"result"`
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, err
	}
	return rec.Result, nil
}

// Do submits a job and waits for its result.
func (c *Client) Do(ctx context.Context, j *job.Job) (*job.Result, error) {
	if j.ID == "" {
		j.ID = job.NewID()
	}
	ch := make(chan *nats.Msg, 1)
	sub, err := c.nc.ChanSubscribe(job.ResultSubject(j.Tenant, j.ID), ch)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if _, err := c.Submit(ctx, j); err != nil {
		return nil, err
	}
	select {
	case m := <-ch:
		var r job.Result
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("sluice: result %s: %w", j.ID, err)
		}
		return &r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Subscribe calls fn with every result of tenant as it is stored. Results
// are published once per job; a subscriber that is not connected at the time
// misses it and can Lookup the job instead.
func (c *Client) Subscribe(tenant string, fn func(*job.Result)) (*nats.Subscription, error) {
	return c.nc.Subscribe(job.ResultPrefix+tenant+".>", func(m *nats.Msg) {
		var r job.Result
		if err := json.Unmarshal(m.Data, &r); err == nil {
			fn(&r)
		}
	})
}
