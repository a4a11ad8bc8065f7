package job

import "time"

// StatusRunning is how GET /v1/jobs and a cancellation name a queued job
// whose provider call has left: not terminal, and not cancellable unless
// its executor can stop the call (a streamed one).
const StatusRunning Status = "running"

// Summary is one job in a list of jobs (GET /v1/jobs) and a cancellation's
// answer.
type Summary struct {
	ID          string    `json:"id"`
	Object      string    `json:"object"` // "job"
	Status      Status    `json:"status"`
	SubmittedAt time.Time `json:"submitted_at"`
	Model       string    `json:"model,omitempty"`
	Error       *Error    `json:"error,omitempty"`
}

// List is a page of jobs, in the shape of OpenAI's list objects: the next
// page starts after LastID while HasMore.
type List struct {
	Object  string    `json:"object"` // "list"
	Data    []Summary `json:"data"`
	HasMore bool      `json:"has_more"`
	LastID  string    `json:"last_id,omitempty"`
}
