package mesh

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/keys"
)

// Waiting is the answer to a WhySubject request: why a queued job has not
// reached the provider yet, and when that is expected to end. Admission
// answers for the jobs it holds or sent back to wait, an executor for the
// jobs it holds for a concurrency slot or a send instant. It names only
// the tenant's own load (Position counts its own jobs), never others'.
type Waiting struct {
	JobID  string `json:"job_id"`
	Reason string `json:"reason"` // docs/API.md, "Why is my job waiting?"
	// Limit: with reason fair_share, the model's limit the tenants share.
	Limit    string    `json:"limit,omitempty"`
	Until    time.Time `json:"until,omitzero"`
	Position int       `json:"position,omitempty"`
}

// The executors answer "why" on a subject of their own: a request to a
// subject two subscriptions of one connection share (admission and the
// executor in one process) gets one answer at most under NATS's response
// permissions, and the second subscriber's delivery spends it.
const (
	// ExecutorWhySubjectPrefix + <tenant>.<job id>: the executor holding
	// the dispatched job answers why it waits.
	ExecutorWhySubjectPrefix = "sluice.executor.why."
	// CancelledSubjectPrefix + <tenant>.<job id>: a job's cancellation won
	// (services/result); admission drops the job if it holds it.
	CancelledSubjectPrefix = "sluice.admission.cancelled."
)

// ExecutorWhySubject asks the executor holding a job why it waits.
func ExecutorWhySubject(tenant, jobID string) string {
	return ExecutorWhySubjectPrefix + keys.Job(tenant, jobID)
}

// CancelledSubject tells admission a job was cancelled.
func CancelledSubject(tenant, jobID string) string {
	return CancelledSubjectPrefix + keys.Job(tenant, jobID)
}

// AskWhy asks admission and the executors at once why a tenant's queued
// job waits and returns the first answer, or false when none comes within
// timeout (no process holds the job: it is on its way, running, or done).
func AskWhy(nc *nats.Conn, tenant, jobID string, timeout time.Duration) (*Waiting, bool) {
	answers := make(chan *Waiting, 2)
	for _, subj := range []string{WhySubject(tenant, jobID), ExecutorWhySubject(tenant, jobID)} {
		go func() {
			var w *Waiting
			if m, err := nc.Request(subj, nil, timeout); err == nil {
				if json.Unmarshal(m.Data, &w) != nil || w == nil || w.Reason == "" {
					w = nil
				}
			}
			answers <- w
		}()
	}
	for range 2 {
		if w := <-answers; w != nil {
			return w, true
		}
	}
	return nil, false
}
