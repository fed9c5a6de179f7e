// Command compass-fake prints its version line for --version, as the
// Compass binaries do, and fails on anything else.
package main

import (
	"fmt"
	"os"

	"github.com/compass-runner/identity/internal/lib/buildinfo"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(buildinfo.VersionLine("compass-fake"))
		return
	}
	fmt.Fprintln(os.Stderr, "compass-fake: only --version")
	os.Exit(2)
}
