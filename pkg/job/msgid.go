package job

import "github.com/sluice-dev/sluice/internal/keys"

// IntakeMsgID is the JetStream message id (Nats-Msg-Id) of a job published
// to INTAKE. INTAKE's duplicate window is stream-wide and a producer sets
// the header itself, so the id names the tenant and the job and carries an
// HMAC, keyed by secret, of them and the envelope: a retry of the same
// publish with the same secret is dropped as a duplicate, while another
// tenant, not knowing the secret, cannot compute the id and make this
// tenant's submission vanish by using it first. Keep the secret for as
// long as a publish may be retried (pkg/client keeps one per Client); an
// empty secret gives an id anyone who knows the envelope can compute.
func IntakeMsgID(secret []byte, tenant, id string, envelope []byte) string {
	return keys.IntakeMsgID(secret, tenant, id, envelope)
}

// Key names the job among every tenant's: a job id is unique only within
// its tenant (two tenants may choose the same one), so whatever Sluice
// keeps per job is kept under Key.
func (j *Job) Key() string { return keys.Job(j.Tenant, j.ID) }
