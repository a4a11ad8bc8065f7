package streams

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestIsTransient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{nats.ErrNoResponders, true},
		{fmt.Errorf("ensure stream QUEUE: %w", nats.ErrTimeout), true},
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 500, ErrorCode: 10023, Description: "insufficient resources"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}, false},
		{errors.New("ensure stream QUEUE: max_msgs_per_subject 5 is below the 9 messages"), false},
		// Not found: lasting, except where Ensure knows another node is
		// making the object.
		{&jetstream.APIError{Code: 404, ErrorCode: 10059, Description: "stream not found"}, false},
		{raced(fmt.Errorf("ensure bucket budgets: %w", &jetstream.APIError{Code: 404, ErrorCode: 10059, Description: "stream not found"})), true},
		{raced(jetstream.ErrBucketNotFound), true},
		{raced(errors.New("ensure stream QUEUE: max_msgs_per_subject 5 is below the 9 messages")), false},
	} {
		if got := IsTransient(tc.err); got != tc.want {
			t.Errorf("IsTransient(%v): got %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestRetryStopsOnPermanentError(t *testing.T) {
	t.Parallel()
	calls := 0
	permanent := errors.New("bad config")
	err := Retry(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return nats.ErrNoResponders
		}
		return permanent
	})
	if !errors.Is(err, permanent) || calls != 3 {
		t.Errorf("got %v after %d calls, want the permanent error after 3", err, calls)
	}
}
