package mesh

import (
	"strings"

	"github.com/sluice-dev/sluice/internal/task"
)

// CoalescePrefix starts the idempotency keys the response cache derives
// for identical requests (internal/cache): requests in flight at once
// share one operation through it, and once that operation has ended the
// next identical request starts a new one under the same key.
const CoalescePrefix = "sluice-coalesce:"

// CallKey is the Idempotency-Key sent to the provider for j's calls: the
// operation's (ProviderKey), or for an operation under a coalescing key,
// which is used again by later generations, the job's own, so a provider
// that honours the key answers a new generation with a new call.
func CallKey(j *task.Task, opKey string) string {
	if strings.HasPrefix(j.IdempotencyKey, CoalescePrefix) {
		return ProviderKey(opKey + "." + j.ID)
	}
	return ProviderKey(opKey)
}
