// Package buildinfo says which build a binary is: the version and revision
// stamped at link time by release builds, else the Go build info. Every
// daemon reports it (--version, compass_build_info, the door's answer).
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Set at link time for release builds and images:
//
//	-ldflags "-X github.com/compass-runner/identity/internal/lib/buildinfo.version=v0.1.0
//	          -X github.com/compass-runner/identity/internal/lib/buildinfo.revision=<git sha>"
//
// Otherwise they come from the build info: the module version ("(devel)" in
// a build from the repository) and the VCS stamp when the build had one.
var version, revision string

// Build describes the running binary.
type Build struct {
	Version   string // module version, or "(devel)"
	Revision  string // VCS revision, or "unknown"
	Modified  bool   // the working tree had changes
	GoVersion string
}

// Read reads the binary's build: link-time values first, then the build
// info.
func Read() Build {
	b := Build{Version: version, Revision: revision}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		b.GoVersion = bi.GoVersion
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Revision == "" {
					b.Revision = s.Value
				}
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
}

// String is the one-line form --version prints after the program's name.
func (b Build) String() string {
	rev := b.Revision
	if b.Modified {
		rev += "+modified"
	}
	return fmt.Sprintf("%s (revision %s, %s)", b.Version, rev, b.GoVersion)
}
