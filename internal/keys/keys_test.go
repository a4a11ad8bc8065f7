package keys

import (
	"fmt"
	"testing"
)

// Every budgets, results and idempotency key, and every message id, made
// from names configuration accepts, is made by one scheme from one set of
// parts: two different things never share a name. The names are chosen to
// collide if a scheme ignored a separator ('-' inside names, a provider
// whose name is another scheme's fixed word).
func TestNoTwoThingsShareAName(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b", "a-b", "b-c", "c", "rate", "conc", "learn", "day", "minute", "retry", "x_y"}
	ids := []string{"0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9f"}
	seen := map[string]string{}
	add := func(name, what string) {
		t.Helper()
		if other, ok := seen[name]; ok && other != what {
			t.Errorf("%q is both %s and %s", name, other, what)
		}
		seen[name] = what
	}
	for _, p := range names {
		if ProviderProblem(p) != "" {
			continue
		}
		for _, m := range names {
			pm := fmt.Sprintf("(%s, %s)", p, m)
			add(Rate(p, m), "rate"+pm)
			add(Conc(p, m), "conc"+pm)
			add(Learn(p, m), "learn"+pm)
			add(PromptCache(p, m), "pcache"+pm)
			add(Calib(p, m, ""), "calib"+pm)
			add(Calib(p, m, "tools"), "calib tools"+pm)
			add(ModelDay(p, m), "model day"+pm)
			add(Health(p, m), "health"+pm)
			add(Affinity(p, m), "affinity"+pm) // a tenant in the provider's place
		}
	}
	for _, tenant := range append(names, ReservedProvider) {
		add(TenantConc(tenant), "tenant conc "+tenant)
		add(TenantMinute(tenant), "tenant minute "+tenant)
		add(TenantDay(tenant), "tenant day "+tenant)
		add(RetryPointer(tenant, "00ff"), "retry pointer "+tenant)
		add(Op(tenant, "00ff"), "op "+tenant)
		for _, id := range ids {
			add(Record(tenant, id), "record "+tenant+"/"+id)
			for _, kind := range []Msg{MsgQueued, MsgDispatch, MsgRetry, MsgResult, MsgDLQ, MsgReplay, MsgChunk} {
				add(MsgID(kind, tenant, id, ""), fmt.Sprintf("%s %s/%s", kind, tenant, id))
				add(MsgID(kind, tenant, id, "7"), fmt.Sprintf("%s %s/%s #7", kind, tenant, id))
			}
		}
	}
	add(LegacyFleetKey, "legacy fleet key")
}

// The provider name configuration reserves is the one TenantConc puts in a
// provider's place: without the reservation, provider "tenant" serving a
// model named like a tenant would share that tenant's concurrency key.
func TestReservedProvider(t *testing.T) {
	t.Parallel()
	if Conc(ReservedProvider, "acme") != TenantConc("acme") {
		t.Fatal("TenantConc no longer shares Conc's scheme: update ReservedProvider's doc and ProviderProblem")
	}
	if ProviderProblem(ReservedProvider) == "" || ProviderProblem("openai") != "" {
		t.Error("ProviderProblem: want the reserved name refused, and only it")
	}
}

// DispatchConsumer is ambiguous for names holding '-': configuration
// refuses such pairs (config's TestKeyNameCollisions).
func TestDispatchConsumerAmbiguity(t *testing.T) {
	t.Parallel()
	if DispatchConsumer("a-b", "c") != DispatchConsumer("a", "b-c") {
		t.Fatal("DispatchConsumer no longer collides for a-b/c and a/b-c: config's check can go")
	}
}

func TestMsgSeq(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		MsgID(MsgChunk, "acme", "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", "12"): "12",
		MsgID(MsgResult, "acme", "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", ""):  "",
		"stream:0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e:3":                       "3", // written before ids named their tenant
	} {
		if got := MsgSeq(id); got != want {
			t.Errorf("MsgSeq(%q) = %q, want %q", id, got, want)
		}
	}
}
