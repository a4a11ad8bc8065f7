package ingest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// CostHeader states a chat completion's cost in its model's units, as the
// job envelope's "cost" does: "images=2" or "images=2, audio_seconds=30".
const CostHeader = "X-Sluice-Cost"

// ParseCost reads an X-Sluice-Cost value: comma-separated name=amount
// pairs, each name at most once. The names and amounts are checked as a
// job's cost is (job.CheckUnits).
func ParseCost(v string) (map[string]int, error) {
	bad := func(format string, args ...any) error {
		return &job.ValidationError{Code: job.CodeInvalidRequest, Field: CostHeader,
			Message: "must be name=amount pairs separated by commas (images=2, audio_seconds=30): " + fmt.Sprintf(format, args...)}
	}
	out := map[string]int{}
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, amount, ok := strings.Cut(part, "=")
		name, amount = strings.TrimSpace(name), strings.TrimSpace(amount)
		if !ok || name == "" {
			return nil, bad("%q has no '='", clip.String(part, 64))
		}
		n, err := strconv.Atoi(amount)
		if err != nil {
			return nil, bad("%q is not a whole number", clip.String(amount, 64))
		}
		if _, dup := out[name]; dup {
			return nil, bad("%q appears twice", clip.String(name, 64))
		}
		out[name] = n
		if len(out) > job.MaxUnits {
			break // CheckUnits names the problem
		}
	}
	if len(out) == 0 {
		return nil, bad("no pair in %q", clip.String(v, 64))
	}
	if err := job.CheckUnits(CostHeader, out); err != nil {
		return nil, err
	}
	return out, nil
}
