package commands

import (
	"context"
	"flag"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/devstack"
	"github.com/compass-runner/identity/server"
)

// devHelp explains dev; the stack itself is package devstack.
const devHelp = `Runs the whole Compass stack in one process, on loopback, for trying it out:

  - an embedded nats-server whose authorization is the auth callout (server-config
    mode, xkey encryption on);
  - compass-callout in-process, resolving tokens with the same verifier as the door;
  - the door on TLS with a dev CA generated at start (written to <data-dir>/ca.pem);
  - SQLite in <data-dir>;
  - a local HTTPS issuer registered as cluster "dev" that writes a Kubernetes-format
    projected token for node "dev-node" to <data-dir>/runner-token and rewrites it
    at 80% of its 600 s lifetime, as a kubelet does;
  - an account token for the admin door in <data-dir>/admin-token.

It prints the compass-runner command to start a Runner against it, and the
ping-runner command that pings that Runner. Stop it with Ctrl-C. Everything is
throwaway: keys and passwords live in memory and change on every start.

Before it writes anything in <data-dir> it checks that its ports (--listen,
--nats-listen) are free and that no other dev holds <data-dir> (a running dev
holds <data-dir>/dev.lock locked). A second dev on the same ports, or in the same
data dir on other ports, fails at once, naming every flag it must change, and
leaves the first one's CA, tokens and database alone.`

var devCommand = &cli.Command{Name: "dev", Summary: "run the whole stack in one process on loopback (NATS, callout, door, dev issuer)", Logs: true,
	Help: devHelp,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var cfg devstack.Config
		fs.StringVar(&cfg.DataDir, "data-dir", server.DefaultDataDir, "directory for the database, the dev CA and the token files")
		fs.StringVar(&cfg.Listen, "listen", devstack.DefaultListen, "door address (TLS, loopback)")
		fs.StringVar(&cfg.NATSListen, "nats-listen", devstack.DefaultNATSListen, "embedded nats-server address")
		return func(ctx context.Context, in *cli.Invocation) error {
			cfg.Logger, cfg.Out = in.Log, in.Stdout
			cfg.ServerVersion = cli.BuildInfo().Version
			return devstack.Run(ctx, cfg)
		}
	},
}
