package mesh

import (
	"slices"
	"testing"
	"time"
)

func TestDecodeTransits(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, c := range []struct {
		name string
		data string
		want []time.Duration
	}{
		{"a report", `{"us":[1500,20]}`, []time.Duration{1500 * time.Microsecond, 20 * time.Microsecond}},
		{"bounded both ways", `{"us":[-7,999999999]}`, []time.Duration{0, 40 * ms}},
		{"not a report", `{"us":"x"}`, nil},
		{"not JSON", `garbage`, nil},
		{"empty", `{}`, []time.Duration{}},
	} {
		got := DecodeTransits([]byte(c.data), 40*ms)
		if !slices.Equal(got, c.want) || (c.want == nil) != (got == nil) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
