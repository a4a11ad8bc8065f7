package job

import (
	"fmt"
	"regexp"
	"strings"
)

// Subjects. Tenant names and model tokens are single subject tokens.
const (
	IntakePrefix   = "sluice.intake."   // sluice.intake.<tenant>
	QueuePrefix    = "sluice.queue."    // sluice.queue.<priority>.<tenant>
	DispatchPrefix = "sluice.dispatch." // sluice.dispatch.<provider>.<model_token>
	ResultPrefix   = "sluice.result."   // sluice.result.<tenant>.<job_id> (republished once stored)
	StorePrefix    = "sluice.rstore."   // sluice.rstore.<tenant>.<job_id> (what RESULTS stores)
	DLQPrefix      = "sluice.dlq."      // sluice.dlq.<tenant>.<job_id>
	SignalPrefix   = "sluice.signal."   // sluice.signal.ratelimit.<provider>.<model_token>
	// WaitPrefix is a request subject: sluice.ingest.wait.<tenant>, with the
	// job envelope INTAKE refused; ingest answers a WaitHint.
	WaitPrefix = "sluice.ingest.wait."
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidName reports whether s can be a tenant or provider name (one subject token).
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ModelToken turns a model name ("gpt-4.1-mini") into one subject token
// ("gpt-4_1-mini"). Configuration rejects two models whose tokens collide.
func ModelToken(model string) string {
	var b strings.Builder
	for _, r := range model {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func IntakeSubject(tenant string) string { return IntakePrefix + tenant }

func WaitSubject(tenant string) string { return WaitPrefix + tenant }

func QueueSubject(p Priority, tenant string) string {
	return fmt.Sprintf("%s%s.%s", QueuePrefix, p, tenant)
}

func DispatchSubject(provider, model string) string {
	return DispatchPrefix + provider + "." + ModelToken(model)
}

func ResultSubject(tenant, jobID string) string { return ResultPrefix + tenant + "." + jobID }

func StoreSubject(tenant, jobID string) string { return StorePrefix + tenant + "." + jobID }

func DLQSubject(tenant, jobID string) string { return DLQPrefix + tenant + "." + jobID }

// TenantFromIntake extracts the tenant from an intake subject.
func TenantFromIntake(subject string) (string, bool) {
	t, ok := strings.CutPrefix(subject, IntakePrefix)
	if !ok || t == "" || strings.Contains(t, ".") {
		return "", false
	}
	return t, true
}
