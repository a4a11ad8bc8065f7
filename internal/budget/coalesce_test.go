package budget_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/sluice-dev/sluice/internal/budget"
)

// ReturnAll and SettleAll leave the window as the same returns and
// settlements one by one would, with one write.
func TestReturnAllAndSettleAllAreOneWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim := budget.Limits{RPM: 600, TPM: 60_000}
	one := budget.Cost{Requests: 1, Tokens: 100}
	for _, lapsed := range []bool{false, true} {
		b := setup(t, pacedParams)
		g, err := b.store.Take(ctx, key, lim, costs(4, one))
		if err != nil || g.N != 4 {
			t.Fatalf("Take: %+v %v, want 4 placed", g, err)
		}
		rs := []budget.Return{
			{At: g.SendAt[1], Cost: budget.Cost{Tokens: 40}},
			{At: g.SendAt[2], Cost: budget.Cost{}}, // nothing: skipped
			{At: g.SendAt[3], Cost: one},           // the newest, whole: a lapse rewinds the pace
		}
		ss := []budget.Settlement{{Slice: g.Slice, Extra: budget.Cost{Tokens: 7}}, {Slice: g.Slice, Extra: budget.Cost{Tokens: 5}}}
		// One by one, on a copy of the same state, by another process.
		kv1 := b.kv.clone()
		s1 := budget.NewStore(kv1, b.p, b.clock.Now)
		for _, r := range rs {
			ret := s1.ReturnAt
			if lapsed {
				ret = s1.ReturnLapsed
			}
			if err := ret(ctx, key, r.At, r.Cost); err != nil {
				t.Fatal(err)
			}
		}
		for _, st := range ss {
			if err := s1.Settle(ctx, key, st.Slice, st.Extra); err != nil {
				t.Fatal(err)
			}
		}

		before, _ := b.kv.stats()
		if err := b.store.ReturnAll(ctx, key, rs, lapsed); err != nil {
			t.Fatal(err)
		}
		if err := b.store.SettleAll(ctx, key, ss); err != nil {
			t.Fatal(err)
		}
		if after, _ := b.kv.stats(); after-before != 2 {
			t.Errorf("lapsed=%v: %d writes, want 2 (one for the returns, one for the settlements)", lapsed, after-before)
		}
		var got, want budget.Window
		if err := json.Unmarshal(b.kv.value(key), &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(kv1.value(key), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("lapsed=%v: window after ReturnAll, SettleAll:\n%+v\nwant (one by one):\n%+v", lapsed, got, want)
		}
		if used, _ := b.store.Used(ctx, key); used.Requests != 3 || used.Tokens != 400-40-100+12 {
			t.Errorf("lapsed=%v: window holds %+v, want 3 requests and %d tokens", lapsed, used, 400-40-100+12)
		}
	}
}

// A lease's blocks that expire together go back to a paced window in one
// write, all of them.
func TestLeaseExpiresInOneWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, pacedParams)
	lim := budget.Limits{RPM: 6_000, TPM: 600_000}
	one := budget.Cost{Requests: 1, Tokens: 100}
	l := budget.NewLease(b.store, key)
	g, err := l.Take(ctx, lim, []budget.Cost{one}, costs(5, one), false, 0)
	if err != nil || g.N != 1 {
		t.Fatalf("Take: %+v %v, want the job placed", g, err)
	}
	// Two blocks spent, three left.
	for range 2 {
		if _, ok := l.Spend(one, false, b.clock.Now(), 0); !ok {
			t.Fatal("Spend: no block")
		}
	}
	before, _ := b.kv.stats()
	l.Expire(ctx, b.clock.Now(), true)
	if after, _ := b.kv.stats(); after-before != 1 {
		t.Errorf("Expire of three blocks: %d writes, want 1", after-before)
	}
	if used, _ := b.store.Used(ctx, key); used.Requests != 3 || used.Tokens != 300 {
		t.Errorf("window holds %+v, want the job and the two blocks spent (3 requests, 300 tokens)", used)
	}
}
