package calib

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/natstest"
)

// answers feeds n answers whose actual/estimated ratio is around ratio
// (±2 %, as a provider's own tokenizer varies from request to request).
func answers(ctx context.Context, tb *Table, class string, ratio float64, n int, rng *rand.Rand) {
	for range n {
		est := 4000 + rng.IntN(1000)
		r := ratio * (0.98 + 0.04*rng.Float64())
		tb.Observe(ctx, "openai", "gpt-4o-mini", class, est, int(math.Round(float64(est)*r)))
	}
}

func TestCorrectionConvergesBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		ratio float64 // actual / estimated
	}{
		{"estimates 15% low", 1.15},
		{"estimates 40% high", 0.6},
		{"exact", 1},
	} {
		tb := New(nil, nil)
		if got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_latin"); got != Prior {
			t.Errorf("%s: before any answer the factor is %.3f, want the prior %.2f", tc.name, got, Prior)
		}
		answers(ctx, tb, "m_latin", tc.ratio, 5, rand.New(rand.NewPCG(1, 2)))
		got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_latin")
		// A high quantile: never below the bulk of the answers, and
		// within the spread of the provider's own variation above them.
		if got < tc.ratio*0.98 || got > tc.ratio*1.03 {
			t.Errorf("%s: after 5 answers the factor is %.3f, want within [%.3f, %.3f]", tc.name, got, tc.ratio*0.98, tc.ratio*1.03)
		}
	}
}

func TestCorrectionFollowsAChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tb := New(nil, nil)
	rng := rand.New(rand.NewPCG(3, 4))
	answers(ctx, tb, "", 1.4, 40, rng)
	answers(ctx, tb, "", 0.9, Window, rng)
	if got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", ""); got > 0.93 {
		t.Errorf("a window after the provider's count fell to 0.9 the factor is %.3f, want it down to about 0.9", got)
	}
	tb.Observe(ctx, "openai", "gpt-4o-mini", "", 100, 100_000)
	if got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", ""); got > MaxRatio {
		t.Errorf("an absurd answer gives a factor of %.3f, want at most %.1f", got, MaxRatio)
	}
}

func TestClassFallsBackToModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tb := New(nil, nil)
	rng := rand.New(rand.NewPCG(5, 6))
	answers(ctx, tb, "m_latin", 1.1, 10, rng)
	if got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_other"); got < 1.07 || got > 1.14 {
		t.Errorf("an unseen class takes the model's factor: got %.3f, want about 1.1", got)
	}
	answers(ctx, tb, "m_other", 0.6, 1, rng)
	if got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_other"); got < 1.07 {
		t.Errorf("after one answer below the model's, a class keeps the larger: got %.3f", got)
	}
	answers(ctx, tb, "m_other", 0.6, ClassSamples, rng)
	if got := tb.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_other"); got > 0.63 {
		t.Errorf("after %d answers a class has its own factor: got %.3f, want about 0.6", ClassSamples+1, got)
	}
}

// The fleet shares what one executor learned, and a restarted fleet starts
// from it.
func TestCorrectionSharedThroughKV(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := natstest.Conn(t, natstest.Server(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "budgets"})
	if err != nil {
		t.Fatal(err)
	}
	exec1, exec2, adm := New(kv, nil), New(kv, nil), New(kv, nil)
	rng := rand.New(rand.NewPCG(7, 8))
	answers(ctx, exec1, "m_latin", 1.15, 3, rng)
	answers(ctx, exec2, "m_latin", 1.15, 2, rng)
	got := adm.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_latin")
	if got < 1.15*0.98 || got > 1.15*1.03 {
		t.Errorf("admission reads a factor of %.3f from two executors' answers, want about 1.15", got)
	}
	st, classes := adm.Lookup(ctx, "openai", "gpt-4o-mini")
	if st.Samples != 5 || classes["m_latin"].Samples != 5 {
		t.Errorf("the fleet's record holds %d samples (class m_latin %d), want 5 each", st.Samples, classes["m_latin"].Samples)
	}
	restarted := New(kv, nil)
	if got := restarted.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_latin"); got < 1.12 {
		t.Errorf("a restarted process starts from a factor of %.3f, want the learned one (about 1.15)", got)
	}
}

// BenchmarkFactor is admission's read of the correction at every
// placement, from the cache: with a timer made for each call (as
// admission did) and with the bound left to Factor.
func BenchmarkFactor(b *testing.B) {
	tb := New(nil, nil)
	answers(context.Background(), tb, "m_latin", 1.1, 50, rand.New(rand.NewPCG(1, 2)))
	b.Run("timeout-per-call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
			_ = tb.Factor(ctx, 0, "openai", "gpt-4o-mini", "m_latin")
			cancel()
		}
	})
	b.Run("wait", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = tb.Factor(context.Background(), 250*time.Millisecond, "openai", "gpt-4o-mini", "m_latin")
		}
	})
}
