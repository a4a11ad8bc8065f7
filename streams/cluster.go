package streams

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaderReadBuckets take compare-and-set traffic: replicated, they read
// from the stream leader (AllowDirect off), never from a follower that may
// not have applied the last write yet. A stale read cannot break a
// compare-and-set (the revision check is the leader's), but every stale
// read is a wasted round trip and a conflict, and a plain read of a
// record written a moment ago (a result, an operation, the fleet key that
// another node created at start, an answer cached just before its result
// went out) must see it.
var LeaderReadBuckets = []string{BucketBudgets, BucketIdempotency, BucketResults, BucketFleet, BucketCache, BucketBatches}

// EvictingBuckets drop their oldest entries to make room when full, where
// nats.go's buckets refuse new ones: a full cache keeps caching, and an
// entry lost to room is only a miss. Per-entry TTLs hold as before. These
// are made as their streams (nats.go has no setting for it).
var EvictingBuckets = []string{BucketCache}

// ensureBucket creates or updates a bucket. A replicated bucket that takes
// compare-and-set traffic is made as its stream, with direct gets off from
// the start: nats.go makes (and, given a bucket that exists, "repairs")
// every bucket with them on, and a process binding a bucket in the moment
// they are on reads from followers for its whole life, and once they are
// off, gets "no responders" for every read. On a forming cluster, where
// every node runs Ensure at once, that moment came: a node's budget reads
// failed for good after a partition healed. An evicting bucket is made as
// its stream too. Other buckets go through nats.go, left alone when they
// already have the settings asked for.
func ensureBucket(ctx context.Context, js jetstream.JetStream, c jetstream.KeyValueConfig) error {
	if evicting := slices.Contains(EvictingBuckets, c.Bucket); evicting || (c.Replicas > 1 && slices.Contains(LeaderReadBuckets, c.Bucket)) {
		want := kvStreamConfig(c)
		if evicting {
			want.Discard = jetstream.DiscardOld
		}
		if st, err := js.Stream(ctx, want.Name); err == nil && sameBucketSettings(st.CachedInfo().Config, want) {
			return nil
		} else if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("ensure bucket %s: %w", c.Bucket, err)
		}
		if _, err := js.CreateOrUpdateStream(ctx, want); err != nil {
			return fmt.Errorf("ensure bucket %s: %w", c.Bucket, err)
		}
		return nil
	}
	if kv, err := js.KeyValue(ctx, c.Bucket); err == nil {
		st, err := kv.Status(ctx)
		if err != nil {
			return fmt.Errorf("ensure bucket %s: %w", c.Bucket, err)
		}
		if s, ok := st.(*jetstream.KeyValueBucketStatus); ok && sameBucketSettings(s.StreamInfo().Config, kvStreamConfig(c)) {
			return nil
		}
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("ensure bucket %s: %w", c.Bucket, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, c); err != nil {
		return fmt.Errorf("ensure bucket %s: %w", c.Bucket, err)
	}
	return nil
}

// kvStreamConfig is the stream nats.go makes for bucket c (its
// prepareKeyValueConfig, for the settings Sluice's buckets use), with
// direct gets off for a replicated bucket that takes compare-and-set
// traffic. TestKVStreamConfigMatchesNATS keeps it in step with nats.go.
func kvStreamConfig(c jetstream.KeyValueConfig) jetstream.StreamConfig {
	dup := 2 * time.Minute
	if c.TTL > 0 && c.TTL < dup {
		dup = c.TTL
	}
	maxBytes, maxMsgSize := c.MaxBytes, int32(c.MaxValueSize)
	if maxBytes == 0 {
		maxBytes = -1
	}
	if maxMsgSize == 0 {
		maxMsgSize = -1
	}
	return jetstream.StreamConfig{
		Name:                   "KV_" + c.Bucket,
		Description:            c.Description,
		Subjects:               []string{"$KV." + c.Bucket + ".>"},
		MaxMsgsPerSubject:      int64(max(c.History, 1)),
		MaxBytes:               maxBytes,
		MaxAge:                 c.TTL,
		MaxMsgSize:             maxMsgSize,
		Storage:                c.Storage,
		Replicas:               max(c.Replicas, 1),
		AllowRollup:            true,
		DenyDelete:             true,
		Duplicates:             dup,
		MaxMsgs:                -1,
		MaxConsumers:           -1,
		AllowDirect:            !(c.Replicas > 1 && slices.Contains(LeaderReadBuckets, c.Bucket)),
		Discard:                jetstream.DiscardNew,
		AllowMsgTTL:            c.LimitMarkerTTL != 0,
		SubjectDeleteMarkerTTL: c.LimitMarkerTTL,
	}
}

// sameBucketSettings reports whether a bucket's stream has the settings
// Sluice asks for.
func sameBucketSettings(cur, want jetstream.StreamConfig) bool {
	return cur.Replicas == want.Replicas && cur.MaxAge == want.MaxAge && cur.MaxMsgsPerSubject == want.MaxMsgsPerSubject &&
		cur.Description == want.Description && cur.SubjectDeleteMarkerTTL == want.SubjectDeleteMarkerTTL && cur.AllowDirect == want.AllowDirect &&
		cur.MaxBytes == want.MaxBytes && cur.Discard == want.Discard
}

// IsTransient reports an error a JetStream cluster gives while it forms,
// elects a leader or loses a node: no responders, timeouts, "JetStream
// system temporarily unavailable", too few peers for the replicas asked
// for, a connection being re-established. Retried, it goes away once the
// cluster has a quorum again.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pe passingError
	if errors.As(err, &pe) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10008, // JetStream system temporarily unavailable
			10023, // insufficient resources (peers) for the replicas
			10005, // no suitable peers for placement
			10074, // cluster not ready / no leader
			10076: // jetstream not enabled (yet, on a forming cluster)
			return true
		}
		if apiErr.Code == 503 {
			return true
		}
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, nats.ErrJetStreamNotEnabled),
		errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.ECONNREFUSED):
		return true
	}
	s := err.Error()
	for _, m := range []string{"temporarily unavailable", "no responders", "insufficient resources", "no suitable peers",
		"timeout", "jetstream not enabled", "leader", "no quorum"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// passingError is an error known, where it was made, to pass: IsTransient
// says so whatever it wraps.
type passingError struct{ error }

func (e passingError) Unwrap() error { return e.error }

// raced marks what a concurrent Ensure on another node causes for a moment
// as transient: an object it is making exists in the cluster's metadata
// but is not served yet, so binding, reading or updating it answers "not
// found". (Elsewhere a stream that is not found is a lasting error.)
func raced(err error) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamNotFound) {
		return passingError{err}
	}
	return err
}

// Retry runs fn until it succeeds, fails with an error that is not
// transient, or ctx ends (then the last error is returned, wrapping
// ctx's). The wait between attempts grows from 100 ms to 2 s.
func Retry(ctx context.Context, fn func(context.Context) error) error {
	return RetryNotify(ctx, fn, nil)
}

// AttemptTimeout bounds one attempt of Retry: a request lost with a
// leader (a forming cluster drops some without an answer) costs this
// much, not the caller's whole deadline. fn must make progress in it;
// Ensure does, since what it made in an attempt stays made.
const AttemptTimeout = 5 * time.Second

// RetryNotify is Retry, calling notify (when not nil) with each
// transient error before waiting.
func RetryNotify(ctx context.Context, fn func(context.Context) error, notify func(error)) error {
	wait := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil || !IsTransient(err) {
			return err
		}
		if notify != nil {
			notify(err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// PullExpiry is the option every service's Consume takes: a pull request
// lives 5 s (nats.go's default is 30 s) with a heartbeat every 2.5 s, so
// a consumer whose leader died without a word (SIGKILL, a lost node)
// notices within about 5 s and pulls from the new leader, instead of
// waiting 30 s for two missed heartbeats.
func PullExpiry() jetstream.PullConsumeOpt { return jetstream.PullExpiry(5 * time.Second) }
