package job

import (
	"crypto/sha256"
	"encoding/hex"
)

// IntakeMsgID is the JetStream message id (Nats-Msg-Id) of a job published
// to INTAKE. INTAKE's duplicate window is stream-wide and a producer sets
// the header itself, so the id names the tenant and a digest of the
// envelope: a retry of the same publish is dropped as a duplicate, while
// another tenant that guesses a job id cannot make this tenant's
// submission vanish (it would have to send the same envelope).
func IntakeMsgID(tenant, id string, envelope []byte) string {
	sum := sha256.Sum256(envelope)
	return "intake:" + tenant + ":" + id + ":" + hex.EncodeToString(sum[:12])
}
