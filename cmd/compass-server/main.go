// Command compass-server is the Compass Server: the gRPC door Runners enroll
// through, the token and Runner store, the operator CLI and a one-process dev
// stack. See "compass-server --help" and docs/server.md.
package main

import (
	"os"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

func main() { os.Exit(cli.Main(commands.Server)) }
