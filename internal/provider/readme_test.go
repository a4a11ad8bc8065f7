package provider_test

import (
	"os"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/provider"
)

// docs/OPERATIONS.md documents the classification table; it must be the one
// in code.
func TestDocsHaveClassTable(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), strings.TrimSpace(provider.ClassTable())) {
		t.Error("docs/OPERATIONS.md's classification table differs from provider.ClassTable(); paste the new one in")
	}
}
