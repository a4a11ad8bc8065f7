package executor

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
)

// Every reason the executor sends a job back for is one of the mesh's
// (mesh.Requeue knows its message-id kind).
func TestBackReasonsAreMeshReasons(t *testing.T) {
	t.Parallel()
	for _, r := range []backReason{backUnverified, backLapsed, backTenantSlot, backBreaker, backDown, backDrain, backFallback} {
		if _, ok := mesh.QueueMsgID(&task.Task{}, mesh.Reason(r.name), "1"); !ok || r.bound <= 0 {
			t.Errorf("back reason %+v: not a mesh reason, or unbounded", r)
		}
	}
}
