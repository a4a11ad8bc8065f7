package job

import "github.com/sluice-dev/sluice/internal/keys"

// IntakeMsgID is the JetStream message id (Nats-Msg-Id) of a job published
// to INTAKE. INTAKE's duplicate window is stream-wide and a producer sets
// the header itself, so the id names the tenant and a digest of the
// envelope: a retry of the same publish is dropped as a duplicate, while
// another tenant that guesses a job id cannot make this tenant's
// submission vanish (it would have to send the same envelope).
func IntakeMsgID(tenant, id string, envelope []byte) string {
	return keys.IntakeMsgID(tenant, id, envelope)
}

// Key names the job among every tenant's: a job id is unique only within
// its tenant (two tenants may choose the same one), so whatever Sluice
// keeps per job is kept under Key.
func (j *Job) Key() string { return keys.Job(j.Tenant, j.ID) }
