// Command compass-runner is the Compass Runner: it enrolls with the Server
// using its token (a projected ServiceAccount token file on Kubernetes, or a
// minted token), connects to NATS with the same token, and serves commands.
// See "compass-runner --help" and docs/runner.md.
package main

import (
	"os"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

func main() { os.Exit(cli.Main(commands.Runner)) }
