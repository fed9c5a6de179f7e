// Package buildinfo mirrors the real internal/lib/buildinfo's link-time
// variables and the daemons' --version line.
package buildinfo

import (
	"fmt"
	"runtime"
)

var version, revision string

// VersionLine is what the real PrintVersion prints for a stamped build.
func VersionLine(program string) string {
	return fmt.Sprintf("%s %s (revision %s, %s)", program, version, revision, runtime.Version())
}
