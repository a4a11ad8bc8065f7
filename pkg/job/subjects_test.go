package job_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/pkg/job"
)

func TestModelToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		model string
		want  string
	}{
		{"gpt-4.1-mini", "gpt-4_1-mini"},
		{"gpt-4o-mini", "gpt-4o-mini"},
		{"gpt-4.1", "gpt-4_1"},
		{"gpt-4_1", "gpt-4_1"}, // collides with gpt-4.1: config rejects the pair
		{"claude-3-5-sonnet-20241022", "claude-3-5-sonnet-20241022"},
		{"meta-llama/Llama-3.1-8B", "meta-llama_Llama-3_1-8B"},
		{"a b*c>d", "a_b_c_d"},
		{"modèle", "mod_le"},
		{"", ""},
	} {
		got := job.ModelToken(tc.model)
		if got != tc.want {
			t.Errorf("ModelToken(%q): got %q, want %q", tc.model, got, tc.want)
		}
		if strings.ContainsAny(got, ".*> \t") {
			t.Errorf("ModelToken(%q) = %q is not a single subject token", tc.model, got)
		}
	}
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"acme", true},
		{"Acme_Corp-2", true},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
		{"", false},
		{"acme.eu", false},
		{"acme*", false},
		{"acme>", false},
		{"ac me", false},
		{"acmé", false},
		{"acme\n", false},
	} {
		if got := job.ValidName(tc.s); got != tc.want {
			t.Errorf("ValidName(%q): got %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	const id = "0190f6b2-7c3a-7d4e-8f00-123456789abc"
	for _, tc := range []struct {
		got, want string
	}{
		{job.IntakeSubject("acme"), "sluice.intake.acme"},
		{job.QueueSubject(job.Interactive, "acme"), "sluice.queue.interactive.acme"},
		{job.QueueSubject(job.Batch, "beta"), "sluice.queue.batch.beta"},
		{job.DispatchSubject("openai", "gpt-4.1-mini"), "sluice.dispatch.openai.gpt-4_1-mini"},
		{job.ResultSubject("acme", id), "sluice.result.acme." + id},
		{job.StoreSubject("acme", id), "sluice.rstore.acme." + id},
		{job.DLQSubject("acme", id), "sluice.dlq.acme." + id},
	} {
		if tc.got != tc.want {
			t.Errorf("subject: got %q, want %q", tc.got, tc.want)
		}
	}
	for _, p := range []string{job.IntakePrefix, job.QueuePrefix, job.DispatchPrefix, job.ResultPrefix, job.StorePrefix, job.DLQPrefix, job.SignalPrefix} {
		if !strings.HasPrefix(p, "sluice.") || !strings.HasSuffix(p, ".") {
			t.Errorf("prefix %q: got no sluice. prefix or no trailing dot", p)
		}
	}
}

func TestTenantFromIntake(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subject string
		want    string
		wantOK  bool
	}{
		{"sluice.intake.acme", "acme", true},
		{job.IntakeSubject("beta-2"), "beta-2", true},
		{"sluice.intake.", "", false},
		{"sluice.intake", "", false},
		{"sluice.intake.acme.extra", "", false},
		{"sluice.queue.batch.acme", "", false},
		{"", "", false},
	} {
		got, ok := job.TenantFromIntake(tc.subject)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("TenantFromIntake(%q): got %q, %v, want %q, %v", tc.subject, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestNewID(t *testing.T) {
	t.Parallel()
	before := time.Now().Truncate(time.Millisecond)
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = job.NewID()
	}
	after := time.Now()
	seen := map[string]bool{}
	for _, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil {
			t.Fatalf("NewID() = %q: %v", id, err)
		}
		if got, want := u.Version(), uuid.Version(7); got != want {
			t.Fatalf("NewID() = %q: version got %d, want %d", id, got, want)
		}
		if got, want := u.Variant(), uuid.RFC4122; got != want {
			t.Fatalf("NewID() = %q: variant got %v, want %v", id, got, want)
		}
		sec, nsec := u.Time().UnixTime()
		if ts := time.Unix(sec, nsec); ts.Before(before) || ts.After(after) {
			t.Fatalf("NewID() = %q: time got %v, want within [%v, %v]", id, ts, before, after)
		}
		if seen[id] {
			t.Fatalf("NewID() = %q twice", id)
		}
		seen[id] = true
	}
	if !slices.IsSorted(ids) {
		t.Errorf("ids made one after another: got unsorted, want sorted by time")
	}
	// A valid job id: Check accepts what NewID makes.
	j := job.Job{ID: ids[0], Request: []byte(minimalRequest)}
	if err := j.Check(job.DefaultLimits); err != nil {
		t.Errorf("Check of a NewID id: got %v, want nil", err)
	}
}
