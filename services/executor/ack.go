package executor

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
)

// A dispatched message's handling ends in an error value, which the
// consume loop (mesh.Consume) or, for a job handed off to a goroutine of
// its own, acknowledge turns into what JetStream is told (mesh.Decide).
var (
	// errSettled: the job was dealt with without a call (ended, or sent
	// back to admission); the message is acknowledged.
	errSettled = errors.New("settled without a call")
	// errTerminate: the message can never run (it does not decode, or
	// names no tenant or key Sluice stores anything under); it is
	// terminated, never redelivered.
	errTerminate = mesh.ErrPoison
)

// decided is err as a mesh decision: errSettled is an acknowledgement.
func decided(err error) error {
	if errors.Is(err, errSettled) {
		return nil
	}
	return err
}

// acknowledge settles msg as the handling of j (nil when it did not
// decode) ended: nil or errSettled acknowledge it, errTerminate terminates
// it, redeliverAfter asks for a redelivery after that long, without a
// log (the wait is expected), and any other error for one after a second.
func (s *Service) acknowledge(msg jetstream.Msg, j *task.Task, err error) {
	id := ""
	if j != nil {
		id = j.ID
	}
	mesh.Settle(msg, decided(err), s.log, "dispatch", id)
}
