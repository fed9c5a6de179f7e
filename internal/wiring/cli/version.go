package cli

import (
	"fmt"
	"io"

	"github.com/compass-runner/identity/internal/lib/buildinfo"
)

// Build describes the running binary (internal/lib/buildinfo, where the
// link-time variables live).
type Build = buildinfo.Build

// BuildInfo reads the binary's build: link-time values first, then the
// build info.
func BuildInfo() Build { return buildinfo.Read() }

// PrintVersion prints "<program> <version> (revision <rev>, <go version>)".
func PrintVersion(w io.Writer, program string) {
	fmt.Fprintf(w, "%s %s\n", program, BuildInfo())
}
