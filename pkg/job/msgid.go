package job

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

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
	return "intake:" + tenant + ":" + id + ":" + keyedDigest(secret, tenant, id, envelope)
}

func keyedDigest(secret []byte, tenant, id string, envelope []byte) string {
	if len(secret) == 0 {
		sum := sha256.Sum256(envelope)
		return hex.EncodeToString(sum[:12])
	}
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(tenant + "\x00" + id + "\x00"))
	h.Write(envelope)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// KeyOf names one tenant's job: "<tenant>.<job id>". A job id is unique
// only within its tenant (two tenants may choose the same one), so
// whatever Sluice keeps per job is kept under this name; it is also the
// key of the job's record in the results bucket.
func KeyOf(tenant, id string) string { return tenant + "." + id }

// Key is KeyOf the job's tenant and id.
func (j *Job) Key() string { return KeyOf(j.Tenant, j.ID) }
