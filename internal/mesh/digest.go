package mesh

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// BodyDigest is the digest of the request a job was submitted with, kept
// in its operation record: a later submission under the same idempotency
// key with another request is refused (job.CodeIdempotencyMismatch)
// instead of answered with the first one's result. It is "" for a job
// without a caller's key, whose operation is the job itself. It hashes
// the body as the job carries it once accepted (compact, as QUEUE holds
// it), so ingest and the executor compute the same.
func BodyDigest(j *task.Task) string {
	if j.IdempotencyKey == "" {
		return ""
	}
	endpoint := j.Endpoint
	if endpoint == "" {
		endpoint = job.EndpointChat
	}
	h := sha256.New()
	h.Write([]byte(endpoint))
	h.Write([]byte{0})
	h.Write(j.Request)
	return hex.EncodeToString(h.Sum(nil)[:16])
}
