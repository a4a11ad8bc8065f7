package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/task"
)

// A consume loop's messages are handled as Watermill's router handles
// them: a Handler returns how its handling ended, as an error value, and
// the loop alone tells JetStream (Settle); recovering from a panic and
// dropping a poison message are Middleware around the handler.

// Handler handles one message. Its error is its decision (Decide): nil
// acknowledges the message, Retry(d) asks for it again after d, Poison(err)
// terminates it, ErrKept leaves it to the handler (which settles it
// later), and any other error asks for it again after a second.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Middleware wraps a Handler.
type Middleware func(Handler) Handler

// ErrKept: the handler kept the message (handed it to a scheduler, or to
// a goroutine of its own) and settles it itself.
var ErrKept = errors.New("kept by its handler")

// ErrPoison marks a message that can never be handled (it does not decode,
// or names nothing Sluice stores anything under): it is terminated, never
// redelivered.
var ErrPoison = errors.New("poison message")

// Poison marks err as the reason a message can never be handled.
func Poison(err error) error {
	if err == nil {
		return ErrPoison
	}
	return fmt.Errorf("%w: %w", ErrPoison, err)
}

// RetryAfter asks for a message again after its duration, without a log
// (the wait is expected).
type RetryAfter time.Duration

func (d RetryAfter) Error() string { return fmt.Sprintf("redeliver after %v", time.Duration(d)) }

// Retry is the decision to have a message again after d.
func Retry(d time.Duration) error { return RetryAfter(d) }

// Decision is what JetStream is told of a message.
type Decision struct {
	Op    Op
	Delay time.Duration // Nak's delay
}

// Op is a decision's acknowledgement.
type Op int

// The acknowledgements.
const (
	OpAck  Op = iota // done with
	OpNak            // again, after Delay
	OpTerm           // never again
	OpKeep           // nothing now: its handler settles it
)

// ErrorDelay is how long a message whose handling failed waits before it
// is delivered again.
const ErrorDelay = time.Second

// Decide is the decision for a handler's error.
func Decide(err error) Decision {
	var later RetryAfter
	switch {
	case err == nil:
		return Decision{Op: OpAck}
	case errors.Is(err, ErrKept):
		return Decision{Op: OpKeep}
	case errors.Is(err, ErrPoison):
		return Decision{Op: OpTerm}
	case errors.As(err, &later):
		return Decision{Op: OpNak, Delay: time.Duration(later)}
	}
	return Decision{Op: OpNak, Delay: ErrorDelay}
}

// Apply tells JetStream d of msg.
func (d Decision) Apply(msg jetstream.Msg) error {
	switch d.Op {
	case OpAck:
		return msg.Ack()
	case OpTerm:
		return msg.Term()
	case OpNak:
		return msg.NakWithDelay(d.Delay)
	}
	return nil
}

// Settle tells JetStream how msg's handling ended (Decide); an unexpected
// error is logged, with the job's id when known ("": none), before the
// message is asked for again.
func Settle(msg jetstream.Msg, err error, log *slog.Logger, what, jobID string) {
	d := Decide(err)
	var later RetryAfter
	if d.Op == OpNak && !errors.As(err, &later) {
		log.Warn(what+": will retry", "job_id", jobID, "err", err)
	}
	_ = d.Apply(msg)
}

// ErrPanicked is the error of a handler that panicked.
var ErrPanicked = errors.New("handler panicked")

// Recover turns a panic in the handler into an error (ErrPanicked): the
// loop goes on and the message is delivered again, not lost. The panic
// is logged with its stack.
func Recover(log *slog.Logger, what string) Middleware {
	return func(h Handler) Handler {
		return func(ctx context.Context, msg jetstream.Msg) (err error) {
			defer func() {
				if p := recover(); p != nil {
					log.Error(what+": handler panicked", "subject", msg.Subject(), "panic", p, "stack", string(debug.Stack()))
					err = fmt.Errorf("%w: %v", ErrPanicked, p)
				}
			}()
			return h(ctx, msg)
		}
	}
}

// PoisonRule is the one rule for a message that can never be handled: it
// is logged once, at error level (subject and reason, never its content),
// counted by Count (stage and code, e.g. JobsRejected), and terminated.
type PoisonRule struct {
	Log   *slog.Logger
	Stage string                   // "queue", "dispatch": the metric's stage and the log's prefix
	Count func(stage, code string) // nil: not counted
}

// Drop applies the rule to msg, dropped for err with code.
func (p PoisonRule) Drop(msg jetstream.Msg, code string, err error) {
	p.Log.Error(p.Stage+": poison message dropped", "subject", msg.Subject(), "code", code, "err", err)
	if p.Count != nil {
		p.Count(p.Stage, code)
	}
	_ = msg.Term()
}

// Middleware applies the rule to the messages its handler says are poison
// (Poison): they are dropped here, once, and the loop told to keep its
// hands off.
func (p PoisonRule) Middleware(h Handler) Handler {
	return func(ctx context.Context, msg jetstream.Msg) error {
		err := h(ctx, msg)
		if errors.Is(err, ErrPoison) {
			code := CodeUndecodable
			var pe *PoisonError
			if errors.As(err, &pe) {
				code = pe.Code
			}
			p.Drop(msg, code, err)
			return ErrKept
		}
		return err
	}
}

// CodeUndecodable is the poison code of a message that does not decode.
const CodeUndecodable = "undecodable"

// PoisonError is a poison message's reason with its metric code.
type PoisonError struct {
	Code string
	Err  error
}

func (e *PoisonError) Error() string   { return e.Code + ": " + fmt.Sprint(e.Err) }
func (e *PoisonError) Unwrap() []error { return []error{ErrPoison, e.Err} }

// DecodeTask decodes the job a QUEUE or DISPATCH message carries
// (task.Decode: a large body's syntax is left to its seal); a message that
// does not decode, or names no job, is poison (CodeUndecodable).
func DecodeTask(msg jetstream.Msg) (*task.Task, error) {
	var j task.Task
	if err := task.Decode(msg.Data(), &j); err != nil || j.ID == "" {
		if err == nil {
			err = errors.New("no job id")
		}
		return nil, &PoisonError{Code: CodeUndecodable, Err: err}
	}
	return &j, nil
}
