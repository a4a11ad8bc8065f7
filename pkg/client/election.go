package client

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ElectionWait bounds how long Submit offers a job again when INTAKE did
// not acknowledge it for a reason that passes (a leader election after a
// node was lost: no responders, a timeout, "JetStream system temporarily
// unavailable"). Every offer carries the same message id, so INTAKE keeps
// one copy however many reach it. Past ElectionWait, or when ctx ends
// first, Submit returns the error; a retry of the same job (same id) is
// still safe within INTAKE's two-minute duplicate window.
const ElectionWait = 15 * time.Second

// publishAttempt bounds one offer: a publish lost with a stream leader is
// never acknowledged, and each such offer costs this much of ElectionWait.
const publishAttempt = 2 * time.Second

// publish publishes msg to JetStream, riding through a leader election.
func (c *Client) publish(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	until := time.Now().Add(ElectionWait)
	retried := false
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		m := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: nats.Header{}}
		for k, v := range msg.Header {
			m.Header[k] = append([]string(nil), v...)
		}
		actx, cancel := context.WithTimeout(ctx, publishAttempt)
		ack, err := c.js.PublishMsg(actx, m)
		cancel()
		if err == nil && retried && ack.Duplicate {
			// An earlier attempt was stored and its ack lost: this
			// publish is not a duplicate of anyone else's.
			ack.Duplicate = false
		}
		if err == nil || !passing(err) || ctx.Err() != nil || time.Now().Add(wait).After(until) {
			return ack, err
		}
		retried = true
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// passing reports a publish error a leader election causes.
func passing(err error) bool {
	if isFull(err) {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}
