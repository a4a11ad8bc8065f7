// Package version says which build of Sluice is running: the module's build
// information (runtime/debug.ReadBuildInfo) — the module version when built
// with `go install module@version`, else the version control revision, time
// and modified flag that `go build` stamps in a checkout — and, where a build
// has no version control information (the image build: .git is not in its
// context), what it passed with -ldflags -X.
package version

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Set with -ldflags "-X github.com/sluice-dev/sluice/internal/version.version=...
// -X github.com/sluice-dev/sluice/internal/version.revision=...": they win
// over the build information (deploy/Dockerfile's build arguments).
var (
	version  string
	revision string
)

// Info is one build's identity.
type Info struct {
	Version   string // module version (v1.2.3, or a pseudo-version from the checkout), the -X value, or "dev"
	Revision  string // the commit built, "" when unknown
	Time      string // the commit's time (RFC 3339), "" when unknown
	Modified  bool   // the checkout had uncommitted changes
	GoVersion string // the Go toolchain that built it
}

// Get returns the running binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return From(bi, version, revision)
}

// From reads bi, then applies the -X overrides ver and rev when set. A nil
// bi (a binary built without module support) gives "dev".
func From(bi *debug.BuildInfo, ver, rev string) Info {
	i := Info{Version: "dev"}
	if bi != nil {
		i.GoVersion = bi.GoVersion
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			i.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.time":
				i.Time = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if ver != "" {
		i.Version = ver
	}
	if rev != "" {
		i.Revision = rev
	}
	if i.Version == "dev" && i.Revision != "" {
		// No version, but a known commit: say which.
		i.Version = "dev-" + short(i.Revision)
		if i.Modified {
			i.Version += "+dirty"
		}
	}
	return i
}

// String is one line: version, then revision, time and modified when
// known, then the Go version.
func (i Info) String() string {
	var detail []string
	if i.Revision != "" {
		detail = append(detail, "revision "+short(i.Revision))
	}
	if i.Time != "" {
		detail = append(detail, i.Time)
	}
	if i.Modified {
		detail = append(detail, "modified")
	}
	if i.GoVersion != "" {
		detail = append(detail, i.GoVersion)
	}
	if len(detail) == 0 {
		return i.Version
	}
	return fmt.Sprintf("%s (%s)", i.Version, strings.Join(detail, ", "))
}

// short is a revision's first 12 characters, as Go's pseudo-versions show it.
func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
