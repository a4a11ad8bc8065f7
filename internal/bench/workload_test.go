package bench

import (
	"bytes"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

func TestGenerate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		bind     Dim
		prompt   [2]int // bounds of every prompt
		maxToks  []int
		minRatio float64
	}{
		{name: "a", bind: Requests, prompt: [2]int{100, 140}, maxToks: []int{shortMax}},
		{name: "b", bind: Tokens, prompt: [2]int{3390, 4610}, maxToks: []int{longMax}},
		{name: "mix", bind: Tokens, prompt: [2]int{100, 4610}, maxToks: []int{shortMax, longMax}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec, ok := LookupSpec(tt.name)
			if !ok {
				t.Fatalf("no spec %q", tt.name)
			}
			w, err := Generate(spec, 1.5, 0.1, 42)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.Binding(); got != tt.bind {
				t.Errorf("binding %s, want %s", got, tt.bind)
			}
			reqs, toks := w.Offered()
			load := ratio(reqs, w.RPM)
			if tt.bind == Tokens {
				load = ratio(toks, w.TPM)
			}
			if load < 1.5 || load > 1.5+float64(longPrompt+longMax)/float64(w.TPM)+0.01 {
				t.Errorf("offered %.2fx the binding limit, want just over 1.5x", load)
			}
			for i, j := range w.Jobs {
				if j.Prompt < tt.prompt[0] || j.Prompt > tt.prompt[1] {
					t.Errorf("job %d: prompt %d tokens, want %d..%d", i, j.Prompt, tt.prompt[0], tt.prompt[1])
				}
				found := false
				for _, m := range tt.maxToks {
					found = found || j.MaxTokens == m
				}
				if !found {
					t.Errorf("job %d: max_tokens %d, want one of %v", i, j.MaxTokens, tt.maxToks)
				}
			}
			again, _ := Generate(spec, 1.5, 0.1, 42)
			if len(again.Jobs) != len(w.Jobs) || !bytes.Equal(again.Jobs[0].Body, w.Jobs[0].Body) {
				t.Error("same seed, different workload")
			}
		})
	}
}

// A simulator counting as Sluice estimates charges what the workload says
// a job costs (by default it counts on its own, and charges otherwise).
func TestJobCostMatchesSimulator(t *testing.T) {
	t.Parallel()
	s, c := setupSim(t, sim.Config{Models: []sim.ModelLimits{{Name: Model, TPM: 1_000_000}}, Count: sim.TokenCount{Mode: sim.CountSluice}})
	spec, _ := LookupSpec("mix")
	w, err := Generate(spec, 1, 0.2, 3)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for i, j := range w.Jobs[:5] {
		if ok, _ := c.do(t.Context(), j, nil); !ok {
			t.Fatalf("job %d failed", i)
		}
		want += int64(j.Cost())
	}
	if got := s.Stats().Models[Model].ChargedTokens; got != want {
		t.Errorf("simulator charged %d tokens, workload says %d", got, want)
	}
}

func TestTrailing60(t *testing.T) {
	t.Parallel()
	tl := make([]sim.Second, 70)
	for i := range tl {
		tl[i] = sim.Second{Successes: 1, SuccessTokens: 10}
	}
	got := trailing60(tl, Tokens)
	if got[0] != 10 || got[59] != 600 || got[69] != 600 {
		t.Errorf("trailing sums %d, %d, %d; want 10, 600, 600", got[0], got[59], got[69])
	}
	if p := percentile([]time.Duration{4, 1, 3, 2}, 0.5); p != 2 {
		t.Errorf("median of 1..4 = %v, want 2 (nearest rank)", p)
	}
}
