package version

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestFrom(t *testing.T) {
	t.Parallel()
	vcs := []debug.BuildSetting{
		{Key: "-trimpath", Value: "true"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "ae3a509c1d2e8f00112233445566778899aabbcc"},
		{Key: "vcs.time", Value: "2026-12-03T05:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	for _, tc := range []struct {
		name     string
		bi       *debug.BuildInfo
		ver, rev string
		want     Info
		line     string
	}{
		{name: "no build info", want: Info{Version: "dev"}, line: "dev"},
		{name: "go install module@version",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sluice-dev/sluice", Version: "v1.4.0"}},
			want: Info{Version: "v1.4.0", GoVersion: "go1.26.8"}, line: "v1.4.0 (go1.26.8)"},
		{name: "go build in a checkout (a pseudo-version)",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261203050000-ae3a509c1d2e+dirty"}, Settings: vcs},
			want: Info{Version: "v0.0.0-20261203050000-ae3a509c1d2e+dirty", Revision: "ae3a509c1d2e8f00112233445566778899aabbcc", Time: "2026-12-03T05:00:00Z", Modified: true, GoVersion: "go1.26.8"},
			line: "v0.0.0-20261203050000-ae3a509c1d2e+dirty (revision ae3a509c1d2e, 2026-12-03T05:00:00Z, modified, go1.26.8)"},
		{name: "a revision but no module version",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			want: Info{Version: "dev-ae3a509c1d2e+dirty", Revision: "ae3a509c1d2e8f00112233445566778899aabbcc", Time: "2026-12-03T05:00:00Z", Modified: true, GoVersion: "go1.26.8"},
			line: "dev-ae3a509c1d2e+dirty (revision ae3a509c1d2e, 2026-12-03T05:00:00Z, modified, go1.26.8)"},
		{name: "-ldflags -X wins (the image build)",
			bi:  &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			ver: "v1.5.0-3-g1234abc", rev: "1234abcdef0123456789",
			want: Info{Version: "v1.5.0-3-g1234abc", Revision: "1234abcdef0123456789", GoVersion: "go1.26.8"},
			line: "v1.5.0-3-g1234abc (revision 1234abcdef01, go1.26.8)"},
		{name: "-X revision only",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			rev:  "1234abcdef0123456789",
			want: Info{Version: "dev-1234abcdef01", Revision: "1234abcdef0123456789", GoVersion: "go1.26.8"},
			line: "dev-1234abcdef01 (revision 1234abcdef01, go1.26.8)"},
	} {
		got := From(tc.bi, tc.ver, tc.rev)
		if got != tc.want {
			t.Errorf("%s: From = %+v, want %+v", tc.name, got, tc.want)
		}
		if s := got.String(); s != tc.line {
			t.Errorf("%s: String = %q, want %q", tc.name, s, tc.line)
		}
	}
}

// The test binary has build information: Get reads it.
func TestGet(t *testing.T) {
	t.Parallel()
	i := Get()
	if i.GoVersion != runtime.Version() || i.Version == "" {
		t.Errorf("Get() = %+v, want go version %s and a version", i, runtime.Version())
	}
}
