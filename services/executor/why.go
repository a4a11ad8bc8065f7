package executor

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/mesh"
)

// The executor's part of "why does this job wait" (mesh.ExecutorWhySubject): a
// dispatched job this process holds waits for its send instant (the model's
// pacing) or for one of the model's concurrency slots (max_concurrency).

// waits owns what this process says of where its dispatched jobs wait.
type waits struct {
	waits sync.Map // job key -> mesh.Waiting
}

// noteWait records why the job of key waits here; forget it with the
// returned func.
func (s *waits) noteWait(key, reason string, until time.Time) func() {
	s.waits.Store(key, mesh.Waiting{Reason: reason, Until: until})
	return func() { s.waits.Delete(key) }
}

// onWhy answers for a job this process holds; nothing for another.
func (s *waits) onWhy(m *nats.Msg) {
	key := strings.TrimPrefix(m.Subject, mesh.ExecutorWhySubjectPrefix)
	v, ok := s.waits.Load(key)
	if !ok || !mesh.ReplyAllowed(m.Reply, "") {
		return
	}
	w := v.(mesh.Waiting)
	w.JobID = key[strings.IndexByte(key, '.')+1:]
	data, _ := json.Marshal(w)
	_ = m.Respond(data)
}
