package mesh

import (
	"strings"
	"testing"
)

// The Idempotency-Key providers see is stable for an operation, differs
// between operations, and shows neither the tenant nor the caller's key.
func TestProviderKey(t *testing.T) {
	t.Parallel()
	opA, _ := OpKey("acme-corp", "order-42", "")
	opB, _ := OpKey("globex", "order-42", "")
	a, b := ProviderKey(opA), ProviderKey(opB)
	if a != ProviderKey(opA) {
		t.Errorf("ProviderKey is not stable: %q then %q", a, ProviderKey(opA))
	}
	if a == b {
		t.Errorf("two tenants' operations with the same caller key share the provider key %q", a)
	}
	for _, k := range []string{a, b} {
		if strings.Contains(k, "acme") || strings.Contains(k, "globex") || strings.Contains(k, "order") || strings.Contains(k, opA[len("acme-corp."):]) {
			t.Errorf("provider key %q reveals the tenant, the caller's key or the bucket key", k)
		}
	}
}
