// Package cli mirrors the real internal/cli's link-time variables and its
// --version line.
package cli

import (
	"fmt"
	"runtime"
)

var version, revision string

// VersionLine is what the real PrintVersion prints for a stamped build.
func VersionLine(program string) string {
	return fmt.Sprintf("%s %s (revision %s, %s)", program, version, revision, runtime.Version())
}
