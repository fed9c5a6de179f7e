// Package commands defines the three daemons' command lines on internal/cli;
// each cmd/* main is one call to cli.Main with one of them.
package commands

import (
	"context"
	"errors"
	"flag"
	"runtime"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/cli"
)

const calloutHelp = `Answers the NATS server's authorization requests ($SYS.REQ.USER.AUTH). For
each CONNECT it takes the client's auth_token, verifies it with the shared
Compass verifier (a Kubernetes projected token against the registered
clusters' keys, or a minted Runner token from the database) and answers with a
user JWT for the Runner's account: named after the Runner ID, allowed only the
Runner's own subjects, expiring no later than the token (and at most
--max-user-jwt-lifetime). Anything else is answered "not authorized", or
"runner cluster keys unavailable" when a registered cluster's keys cannot be
used; the cause is logged with the cluster name, never the token.

Two NATS auth modes (see docs/callout.md and deploy/nats/):
  --mode server-config  authorization { auth_callout { issuer, auth_users,
                        account, xkey } }: --issuer-seed-file is the issuer
                        account seed, --account the Runners' account name.
  --mode operator       the callout account JWT carries authorization
                        { auth_users, allowed_accounts, xkey }: --issuer-seed-file
                        is the callout account seed or one of its signing
                        keys (then --callout-account is the account),
                        --user-signing-seed-file the Runners' account seed or a
                        signing key of it, --account that account's public key.

With --xkey-seed-file every request must be sealed to that key and answers are
sealed to the server; without it sealed requests are refused. Replicas share
the load as one queue group; --connections spreads one replica's answers over
several connections (the server handles each answer on the read loop of the
connection it came from). SIGTERM drains: no new requests are taken, queued
ones are answered, then it exits. SIGHUP, or a change of the file, reloads
--runner-clusters; an invalid new file leaves the old one in force.

Secrets are read from files or the environment, never from flags.`

// Callout is compass-callout.
var Callout = &cli.Command{
	Name: "compass-callout",
	Help: calloutHelp,
	Logs: true,
	Env:  []cli.EnvVar{{Name: "COMPASS_NATS_PASSWORD", Usage: "password of --nats-user (or --nats-password-file)"}},
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		cfg := callout.ServeConfig{Mode: callout.ModeServerConfig}
		var passwordFile string
		fs.StringVar(&cfg.NATSURLs, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated")
		fs.StringVar(&cfg.NATSCreds, "nats-creds", "", "credentials file of the callout user (operator mode: a user of the callout account listed in auth_users)")
		fs.StringVar(&cfg.NATSNkeyFile, "nats-nkey", "", "nkey seed file of the callout user (server-config mode, an nkey user in auth_users)")
		fs.StringVar(&cfg.NATSUser, "nats-user", "", "user name of the callout user (server-config mode), with --nats-password-file\nor COMPASS_NATS_PASSWORD")
		fs.StringVar(&passwordFile, "nats-password-file", "", "file holding the password of --nats-user")
		fs.StringVar(&cfg.NATSCAFile, "nats-ca-file", "", "PEM CA for a tls:// NATS server (default: system roots)")
		fs.Var(&cfg.Mode, "mode", "NATS auth mode: server-config or operator")
		fs.StringVar(&cfg.IssuerSeedFile, "issuer-seed-file", "", "account seed that signs answers (server-config: the auth_callout issuer, which also signs\nuser JWTs; operator: the callout account or one of its signing keys)")
		fs.StringVar(&cfg.CalloutAccount, "callout-account", "", "operator mode: the callout account's public key, when --issuer-seed-file is a signing key of it")
		fs.StringVar(&cfg.UserSeedFile, "user-signing-seed-file", "", "operator mode: seed of the Runners' account or of one of its signing keys")
		fs.StringVar(&cfg.Account, "account", "", "the Runners' account: its name (server-config mode) or public key (operator mode;\ndefault: the key of --user-signing-seed-file)")
		fs.StringVar(&cfg.XKeySeedFile, "xkey-seed-file", "", "curve (xkey) seed whose public key is the server's xkey setting; requests must then be sealed")
		fs.StringVar(&cfg.RunnerClusters, "runner-clusters", "", "cluster file (DL-440): the Kubernetes clusters whose projected tokens are accepted")
		fs.StringVar(&cfg.DatabaseURL, "database-url", "", "store with minted Runner tokens (postgres://..., sqlite://PATH); without it only projected tokens are accepted")
		fs.DurationVar(&cfg.MaxUserLifetime, "max-user-jwt-lifetime", callout.DefaultMaxLifetime, "cap on a user JWT's lifetime; it never outlives the token either")
		fs.DurationVar(&cfg.AnswerHorizon, "answer-horizon", callout.DefaultAnswerHorizon, "longest a request may wait after it arrives and still be answered (at least "+callout.MinAnswerHorizon.String()+").\n"+
			"nats-server sends a client its first PING 2 s (plus up to 20 %) after its CONNECT, before\n"+
			"it asks the callout, and nats.go fails a CONNECT whose first answer is that PING: a Runner\n"+
			"waits about 2 s, whatever authorization { timeout } says. A request past the horizon is\n"+
			"dropped unverified; a key fetch that cannot end inside it goes on for the next attempt\n"+
			"and the request is refused in time")
		fs.IntVar(&cfg.Connections, "connections", callout.DefaultConnections, "NATS connections to answer on (one queue group)")
		fs.IntVar(&cfg.Workers, "workers", 4*runtime.GOMAXPROCS(0), "requests handled at once")
		fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "127.0.0.1:9090", "address for /metrics, /healthz and /readyz (empty disables; loopback by default,\nthe manifests set the pod's address)")
		fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", callout.DefaultDrainTimeout, "longest a SIGTERM drain waits for queued requests")
		return func(ctx context.Context, in *cli.Invocation) error {
			var err error
			if cfg.NATSPassword, err = cli.Secret(in.Getenv, "nats-password-file", passwordFile, "COMPASS_NATS_PASSWORD"); err != nil {
				return err
			}
			if cfg.Connections < 1 || cfg.Workers < 1 {
				return cli.UsageError(errors.New("--connections and --workers must be at least 1"))
			}
			if err := cfg.Check(); err != nil {
				return cli.UsageError(err)
			}
			cfg.Logger = in.Log
			return callout.Serve(ctx, cfg)
		}
	},
}
