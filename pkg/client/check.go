package client

import (
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// ErrInvalidID is a job id that is not a UUID in canonical form, the only
// form Sluice assigns or accepts. A job id becomes part of a NATS subject
// and a KV key: one of another shape is refused before it reaches the
// connection (a subject longer than the server's control line would make
// the server close it).
var ErrInvalidID = errors.New("sluice: job id must be a UUID in canonical form (lower-case 8-4-4-4-12 hex)")

// checkRef checks a tenant name and, unless empty, a job id before either
// goes into a subject.
func checkRef(tenant, id string) error {
	if !job.ValidName(tenant) {
		return fmt.Errorf("sluice: tenant %q is not a valid name", clip.String(tenant, 64))
	}
	if id != "" && !job.CanonicalID(id) {
		return ErrInvalidID
	}
	return nil
}
