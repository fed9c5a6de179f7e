// Command compass-callout is the NATS auth-callout service of Compass (DL-316):
// a Runner connects to NATS with nothing but its token and gets a user JWT that
// lets it touch only its own subjects. See "compass-callout --help" and
// docs/callout.md.
package main

import (
	"os"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

func main() { os.Exit(cli.Main(commands.Callout)) }
