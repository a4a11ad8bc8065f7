package executor

import (
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluice-dev/sluice/internal/task"
)

// A dispatched message's handling ends in an error value, and acknowledge
// is the one place that turns it into what JetStream is told.
var (
	// errSettled: the job was dealt with without a call (ended, or sent
	// back to admission); the message is acknowledged.
	errSettled = errors.New("settled without a call")
	// errTerminate: the message can never run (it does not decode, or
	// names no tenant or key Sluice stores anything under); it is
	// terminated, never redelivered.
	errTerminate = errors.New("terminate")
)

// acknowledge settles msg as the handling of j (nil when it did not
// decode) ended: nil or errSettled acknowledge it, errTerminate terminates
// it, redeliverAfter asks for a redelivery after that long, without a
// log (the wait is expected), and any other error for one after a second.
func (s *Service) acknowledge(msg jetstream.Msg, j *task.Task, err error) {
	var later redeliverAfter
	switch {
	case err == nil || errors.Is(err, errSettled):
		_ = msg.Ack()
	case errors.Is(err, errTerminate):
		_ = msg.Term()
	case errors.As(err, &later):
		_ = msg.NakWithDelay(time.Duration(later))
	default:
		id := ""
		if j != nil {
			id = j.ID
		}
		s.log.Warn("dispatch: will retry", "job_id", id, "err", err)
		_ = msg.NakWithDelay(time.Second)
	}
}
