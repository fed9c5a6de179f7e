package commands

import (
	"context"
	"errors"
	"flag"
	"runtime"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/kick"
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
sealed to the server; without it sealed requests are refused. nats-server
cannot reload its auth_callout keys, so a new issuer or xkey reaches a NATS
cluster one restarted node at a time: the --next-* seed files hold the new
keys beside the current ones for that roll, and each request is answered
with the keys its server was started with (docs/self-host.md, "Rotating the
callout's keys"). A request carries
the Runner's token, so without --xkey-seed-file a --nats-url that is not tls://
or wss:// must be loopback: start refuses another host unless
--allow-plaintext-nats is set (and then warns). Replicas share
the load as one queue group; --connections spreads one replica's answers over
several connections (the server handles each answer on the read loop of the
connection it came from). SIGTERM drains: no new requests are taken, queued
ones are answered, then it exits. SIGHUP, or a change of the file, reloads
--runner-clusters; an invalid new file leaves the old one in force.

Revocation: with a kick identity (--kick-creds, --kick-nkey or --kick-user: a
NATS system-account user allowed only the servers' CONNZ and KICK requests) the
callout ends the live connections of a Runner the doors no longer accept: a
node denied in the cluster file, a cluster removed, a minted token revoked or
expired. It checks every live Runner connection on each change (SIGHUP, the
file poll, --revocation-poll for revoke-token) and every --sweep-interval:
from the account's connect and disconnect events when the kick identity may
follow them, asking the servers for a full listing only every --list-interval
(or when events were lost), else from a listing each time.
When a Runner ID authenticates while it already has a live connection, the
older one is ended after --duplicate-grace (--duplicates keep: only logged and
counted). --no-kick runs without it.

Quarantine (DL-459): a copied token and its original would displace each other
for ever, each connect ending the other's connection. Each displacement is
counted in --database-url, shared by every replica; a Runner ID displaced more
than --quarantine-after times within --quarantine-window is quarantined: every
connection of it is ended, its connects refused here and its Enroll refused at
the Server's door, until an operator runs compass-server clear-quarantine
--runner-id ID (after revoking the copied token or rotating the node's). It is
logged at ERROR with both clients, counted in compass_callout_quarantines_total
and shown by compass_callout_runners_quarantined (alert CompassRunnerQuarantined).
--quarantine-after 0 counts nothing here; --duplicates keep and a callout
without --database-url never quarantine. A quarantine in the store is refused
whatever this replica's flags.

Secrets are read from files or the environment, never from flags.`

// Callout is compass-callout.
var Callout = &cli.Command{
	Name: "compass-callout",
	Help: calloutHelp,
	Logs: true,
	Env: []cli.EnvVar{
		natsPasswordEnv,
		{Name: "COMPASS_KICK_PASSWORD", Usage: "password of --kick-user (or --kick-password-file)"},
	},
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		cfg := callout.ServeConfig{Mode: callout.ModeServerConfig}
		var passwordFile, kickPasswordFile string
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
		fs.StringVar(&cfg.NextXKeySeedFile, "next-xkey-seed-file", "", "key rotation: the next xkey's seed, held beside --xkey-seed-file while the NATS servers restart\nonto it; a request is opened with whichever of the two it was sealed to, and answered with it")
		fs.StringVar(&cfg.NextIssuerSeedFile, "next-issuer-seed-file", "", "key rotation: the next issuer's seed (server-config: the auth_callout issuer a request names\nis the one that answers it; operator: the callout account's next signing key, with\n--next-xkey-seed-file)")
		fs.StringVar(&cfg.NextUserSeedFile, "next-user-signing-seed-file", "", "key rotation, operator mode: the Runners' account's next signing key, for requests sealed to\n--next-xkey-seed-file")
		fs.BoolVar(&cfg.AllowPlaintextNATS, "allow-plaintext-nats", false, "start even with a nats:// or ws:// --nats-url to a non-loopback host and no --xkey-seed-file,\nwhich sends every Runner's token across the network in clear text (logged as a warning)")
		fs.StringVar(&cfg.KickCreds, "kick-creds", "", "credentials file of the kick identity (operator mode: a user of the system account allowed\nonly $SYS.REQ.SERVER.PING.CONNZ, $SYS.REQ.SERVER.*.CONNZ and $SYS.REQ.SERVER.*.KICK)")
		fs.StringVar(&cfg.KickNkeyFile, "kick-nkey", "", "nkey seed file of the kick identity (server-config mode: an nkey user of the system account)")
		fs.StringVar(&cfg.KickUser, "kick-user", "", "user name of the kick identity (server-config mode: a user of the system account, listed in\nauth_users), with --kick-password-file or COMPASS_KICK_PASSWORD")
		fs.StringVar(&kickPasswordFile, "kick-password-file", "", "file holding the password of --kick-user")
		fs.BoolVar(&cfg.NoKick, "no-kick", false, "run without a kick identity: a denied node, a removed cluster or a revoked token then keeps\nits live NATS connections until their user JWTs expire (not recommended)")
		fs.Var(&cfg.Duplicates, "duplicates", "when a Runner ID authenticates while it has a live connection: kick-older (newest wins) or\nkeep (log and count only)")
		fs.DurationVar(&cfg.DuplicateGrace, "duplicate-grace", kick.DefaultDuplicateGrace, "how long two live connections of one Runner ID may overlap before the older counts as a\nduplicate (a Runner's own handover drains its old connection within this)")
		fs.IntVar(&cfg.QuarantineAfter, "quarantine-after", callout.DefaultQuarantineAfter, "quarantine a Runner ID displaced (its older connection ended as a duplicate) more than this\nmany times within --quarantine-window, until compass-server clear-quarantine; 0: never")
		fs.DurationVar(&cfg.QuarantineWindow, "quarantine-window", callout.DefaultQuarantineWindow, "the window --quarantine-after counts displacements in, from the first (at least "+callout.MinQuarantineWindow.String()+")")
		fs.DurationVar(&cfg.SweepInterval, "sweep-interval", kick.DefaultSweepInterval, "how often every live Runner connection is checked again, besides on each change")
		fs.DurationVar(&cfg.ListInterval, "list-interval", kick.DefaultListInterval, "how often at most a check of every live Runner connection lists them from every NATS\nserver while the account's connect and disconnect events show them (the checks between ask\nno server)")
		fs.DurationVar(&cfg.RevocationPoll, "revocation-poll", callout.DefaultRevocationPoll, "how often --database-url is read for tokens revoked by another process (revoke-token)")
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
			if cfg.NATSPassword, err = cli.Secret(in.Getenv, "nats-password-file", passwordFile, natsPasswordEnv.Name); err != nil {
				return err
			}
			if cfg.KickPassword, err = cli.Secret(in.Getenv, "kick-password-file", kickPasswordFile, "COMPASS_KICK_PASSWORD"); err != nil {
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
