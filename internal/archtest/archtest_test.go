// Package archtest checks rules of the code's shape that the compiler
// does not: for now, that no type in services/ has more than
// MaxMethods methods, promoted methods included (a Service that embeds
// its parts has all their methods, so splitting it by embedding is no
// split).
package archtest

import (
	"fmt"
	"go/types"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// MaxMethods bounds a type's method set: every method callable on a *T
// (exported or not, declared on T or promoted from what T embeds).
const MaxMethods = 30

// TestMethodSets type-checks services/... and fails for each type whose
// pointer's method set exceeds MaxMethods, naming its largest sources.
func TestMethodSets(t *testing.T) {
	t.Parallel()
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, "github.com/sluice-dev/sluice/services/...")
	if err != nil {
		t.Fatal(err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		t.Fatal("services/... does not type-check")
	}
	if len(pkgs) < 4 {
		t.Fatalf("loaded %d packages under services/, want at least admission, executor, ingest and result", len(pkgs))
	}
	checked := 0
	for _, p := range pkgs {
		scope := p.Types.Scope()
		largest, most := "", 0
		for _, name := range scope.Names() {
			tn, ok := scope.Lookup(name).(*types.TypeName)
			if !ok || tn.IsAlias() {
				continue
			}
			checked++
			ms := methodSet(tn.Type())
			if ms.Len() > most {
				largest, most = name, ms.Len()
			}
			if ms.Len() > MaxMethods {
				t.Errorf("%s.%s has %d methods (at most %d, promoted included): %s", p.PkgPath, name, ms.Len(), MaxMethods, bySource(ms))
			}
		}
		t.Logf("%s: largest method set %s, %d", p.PkgPath, largest, most)
	}
	if checked == 0 {
		t.Fatal("no type checked")
	}
}

// methodSet is T's method set if T is an interface, else *T's.
func methodSet(t types.Type) *types.MethodSet {
	if types.IsInterface(t) {
		return types.NewMethodSet(t)
	}
	return types.NewMethodSet(types.NewPointer(t))
}

// bySource counts a method set's methods by the type that declares
// them, largest first.
func bySource(ms *types.MethodSet) string {
	n := map[string]int{}
	for i := range ms.Len() {
		sig := ms.At(i).Obj().Type().(*types.Signature)
		recv := "?"
		if r := sig.Recv(); r != nil {
			recv = types.TypeString(r.Type(), func(p *types.Package) string { return p.Name() })
		}
		n[strings.TrimPrefix(recv, "*")]++
	}
	srcs := make([]string, 0, len(n))
	for s := range n {
		srcs = append(srcs, s)
	}
	slices.SortFunc(srcs, func(a, b string) int { return n[b] - n[a] })
	out := make([]string, len(srcs))
	for i, s := range srcs {
		out[i] = fmt.Sprintf("%s %d", s, n[s])
	}
	return strings.Join(out, ", ")
}
