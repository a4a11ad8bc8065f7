package mesh

import "github.com/sluice-dev/sluice/pkg/job"

// A job id and a tenant name reach this package from callers (an HTTP
// path, a message) and become KV keys and subjects. Each is checked here
// too, whatever the caller checked: a subject longer than the server's
// control line (4 KiB) makes the server refuse it with an error on which
// the client closes its connection for good, and a wildcard in a
// subscription would read other jobs' results. A value of another shape
// names no record: job.ErrNotFound.

// jobRef reports whether tenant (unless "") and id can name a job.
func jobRef(tenant, id string) bool {
	return job.CanonicalID(id) && (tenant == "" || job.ValidName(tenant))
}

// maxOpKey bounds an idempotency bucket key: a tenant name and a few
// fixed-size tokens (OpKey, the retry pointers).
const maxOpKey = 128

// validOpKey reports whether k can be an idempotency bucket key: the KV
// key characters, no empty token, and short.
func validOpKey(k string) bool {
	if k == "" || len(k) > maxOpKey || k[0] == '.' || k[len(k)-1] == '.' {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '.':
			if k[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return true
}
