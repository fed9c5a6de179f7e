package commands

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/deploy"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/internal/lib/doorhttp"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/server"
)

const serverHelp = `The Compass Server. It owns the gRPC door Runners enroll through (TLS only;
minted tokens or Kubernetes projected tokens, DL-440), the store of minted
tokens and enrolled Runners, and the operator CLI.`

// Server is compass-server and its commands.
var Server = &cli.Command{Name: "compass-server", Help: serverHelp, Subcommands: []*cli.Command{
	serveCommand, devCommand, migrateCommand, checkSchemaCommand, backupCommand, restoreCommand, mintRunnerCommand, mintAccountCommand, revokeCommand, clearQuarantineCommand,
	listTokensCommand, runnersCommand, pingCommand, manifestsCommand, natsPasswordHashCommand,
}}

// doorFlags are the flags of commands that call the Server's admin door.
type doorFlags struct {
	server    string
	caFile    string
	tokenFile string
}

func (d *doorFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.server, "server", "", "the Server's door, https://HOST:PORT")
	fs.StringVar(&d.caFile, "ca-file", "", "PEM CA to trust for the door besides the system roots (dev: .data/ca.pem)")
	fs.StringVar(&d.tokenFile, "token-file", "", "file holding an account token (mint-account-token); or set COMPASS_TOKEN to the token itself")
}

// doorEnv documents the admin commands' environment-only token.
var doorEnv = []cli.EnvVar{{Name: "COMPASS_TOKEN", Usage: "an account token (or --token-file)"}}

// client returns an AdminService client and the account token.
func (d *doorFlags) client(getenv func(string) string) (adminv1connect.AdminServiceClient, string, error) {
	if d.server == "" {
		return nil, "", cli.UsageError(errors.New("--server (or COMPASS_SERVER) is required"))
	}
	tok, err := cli.Secret(getenv, "token-file", d.tokenFile, "COMPASS_TOKEN")
	if err != nil {
		return nil, "", err
	}
	if tok == "" {
		return nil, "", cli.UsageError(errors.New("an account token is required: --token-file or COMPASS_TOKEN"))
	}
	hc, err := doorClient(d.server, d.caFile)
	if err != nil {
		return nil, "", err
	}
	return adminv1connect.NewAdminServiceClient(hc, d.server, connect.WithGRPC()), tok, nil
}

// natsPasswordEnv is the password of --nats-user, which serve and
// compass-callout read from the environment or --nats-password-file, never
// from a flag.
var natsPasswordEnv = cli.EnvVar{Name: "COMPASS_NATS_PASSWORD", Usage: "password of --nats-user (or --nats-password-file)"}

const serveHelp = `Runs the Server until SIGINT/SIGTERM, then shuts down gracefully.

The door (compass.runner.v1.RunnerService for Runners, compass.admin.v1.AdminService
for accounts) speaks gRPC, gRPC-Web and Connect over TLS only. Runners present a
minted Runner token or, on a registered Kubernetes cluster, their projected
ServiceAccount token (audience compass-runner); both resolve through the same
verifier the NATS auth callout uses.

--runner-clusters names the cluster file (DL-440): the trust root for projected
tokens. Without it no cluster is trusted and only minted tokens work. With it, the
Server refuses to start while a live minted Runner token has "/" in its ID.

--database-url names the database (empty: SQLite at <data-dir>/compass.db). An
SQLite database is migrated on start; a PostgreSQL one, shared with other Servers
and callouts, must be migrated first with compass-server migrate, and serve refuses
to start on a schema behind it. A schema ahead of this binary (migrated by a newer
release) is refused on both.

With --nats-url the Server connects to NATS as one of the callout's auth_users
(--nats-user and COMPASS_NATS_PASSWORD or --nats-password-file; or --nats-creds in
operator mode), answers ping-runner, and keeps each Runner's last_seen from its events.`

var serveCommand = &cli.Command{Name: "serve", Summary: "run the Server: the TLS door, the store, last_seen from Runner events",
	Help: serveHelp, Logs: true, Env: []cli.EnvVar{natsPasswordEnv}, Flags: serveFlags}

// serveFlags registers serve's flags: the store's, the door's, NATS's and
// the metrics listener's.
func serveFlags(fs *flag.FlagSet) cli.RunFunc {
	var cfg server.ServeConfig
	var sf storeFlags
	sf.register(fs)
	registerDoorFlags(fs, &cfg)
	passwordFile := registerNATSFlags(fs, &cfg)
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "address of the Prometheus /metrics listener (empty: none)")
	return func(ctx context.Context, in *cli.Invocation) error {
		return runServe(ctx, in, cfg, sf, *passwordFile)
	}
}

// registerDoorFlags registers the door's flags: its address, its TLS pair
// and the cluster file whose projected tokens it trusts.
func registerDoorFlags(fs *flag.FlagSet, cfg *server.ServeConfig) {
	fs.StringVar(&cfg.Listen, "listen", ":8443", "door address (TLS)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate chain of the door (required)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of the door (required)")
	fs.StringVar(&cfg.RunnerClusters, "runner-clusters", "", "cluster file registering Kubernetes clusters whose projected tokens are trusted")
}

// registerNATSFlags registers the flags of the Server's NATS connection and
// of the URL Enroll tells Runners; it returns --nats-password-file's value.
func registerNATSFlags(fs *flag.FlagSet, cfg *server.ServeConfig) *string {
	var passwordFile string
	fs.StringVar(&cfg.NATS.URL, "nats-url", "", "NATS server(s) the Server connects to, comma-separated")
	fs.StringVar(&cfg.RunnerNATSURL, "runner-nats-url", "", "NATS URL(s) Enroll tells Runners to use, without credentials (default: --nats-url without its user part)")
	fs.StringVar(&cfg.NATS.User, "nats-user", "", "NATS user (server-config callout mode: one of auth_callout.auth_users)")
	fs.StringVar(&passwordFile, "nats-password-file", "", "file holding the NATS user's password (or set COMPASS_NATS_PASSWORD)")
	fs.StringVar(&cfg.NATS.Creds, "nats-creds", "", "NATS credentials file (operator mode)")
	fs.StringVar(&cfg.NATS.CAFile, "nats-ca-file", "", "PEM CA for a TLS NATS server")
	return &passwordFile
}

// runServe completes cfg with the store flags, the logger and the NATS
// password, then runs the Server until ctx ends.
func runServe(ctx context.Context, in *cli.Invocation, cfg server.ServeConfig, sf storeFlags, passwordFile string) error {
	var err error
	cfg.DatabaseURL, cfg.DataDir, cfg.Logger = sf.databaseURL, sf.dataDir, in.Log
	cfg.ServerVersion = cli.BuildInfo().Version
	if cfg.NATS.Password, err = cli.Secret(in.Getenv, "nats-password-file", passwordFile, natsPasswordEnv.Name); err != nil {
		return err
	}
	return server.Serve(ctx, cfg)
}

var pingCommand = &cli.Command{Name: "ping-runner", Summary: "ping a Runner over NATS through the Server's admin door", Args: "RUNNER_ID", NArgs: 1, Env: doorEnv,
	Help: `Pings a Runner: the Server sends {"command":"ping"} to the Runner's NATS command
subject (compass.runner.<id>.cmd) and returns the Runner's answer and the
round-trip time. It goes through the Server's admin door with an account token:

  compass-server ping-runner --server https://127.0.0.1:8443 --ca-file .data/ca.pem \
    --token-file .data/admin-token dev/dev-node

The exit code is 0 when the Runner answered ok, 1 otherwise.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var df doorFlags
		df.register(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			getenv, stdout, rest := in.Getenv, in.Stdout, in.Args
			client, tok, err := df.client(getenv)
			if err != nil {
				return err
			}
			req := connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: rest[0]})
			req.Header().Set("Authorization", "Bearer "+tok)
			res, err := client.PingRunner(ctx, req)
			if err != nil {
				return fmt.Errorf("server: ping %s: %w", rest[0], err)
			}
			fmt.Fprintf(stdout, "%s\nrtt: %s\n", res.Msg.GetAnswerJson(), res.Msg.GetRtt().AsDuration())
			var ans struct {
				OK    bool   `json:"ok"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(res.Msg.GetAnswerJson()), &ans); err != nil || !ans.OK {
				return fmt.Errorf("server: ping %s: the Runner did not answer ok", rest[0])
			}
			return nil
		}
	},
}

var manifestsCommand = &cli.Command{Name: "manifests", Summary: "print the Kubernetes manifests for Runner identity",
	Help: deploy.ManifestsHelp,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		p := deploy.ManifestFlags(fs)
		o := deploy.ManifestsOptionFlags(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			out, err := deploy.RenderManifests(*p, *o)
			if err != nil {
				return cli.UsageError(err)
			}
			if _, err := in.Stdout.Write(out); err != nil {
				return fmt.Errorf("server: manifests: write: %w", err)
			}
			return nil
		}
	},
}

var natsPasswordHashCommand = &cli.Command{Name: "nats-password-hash", Summary: "print the bcrypt hash of a NATS password, for Secret compass-nats-users",
	Env: []cli.EnvVar{{Name: "COMPASS_NATS_PASSWORD", Usage: "the password to hash (or --password-file)"}},
	Help: `Prints the bcrypt hash (cost 11, the "$2a$" form nats-server reads from its
environment) of a NATS password, for Secret compass-nats-users: the in-cluster
nats-server then holds only hashes of the compass-callout, compass-server and
compass-kick passwords, and compares each CONNECT with them.

  openssl rand -hex 32 > callout-nats-password
  compass-server nats-password-hash --password-file callout-nats-password > callout-nats-password.bcrypt

The file's trailing newline is not part of the password, as for every
--*-password-file the daemons read. The password is never printed.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var file string
		fs.StringVar(&file, "password-file", "", "file holding the password (or COMPASS_NATS_PASSWORD)")
		return func(ctx context.Context, in *cli.Invocation) error {
			pw, err := cli.Secret(in.Getenv, "password-file", file, "COMPASS_NATS_PASSWORD")
			if err != nil {
				return err
			}
			if pw == "" {
				return cli.UsageError(errors.New("give the password with --password-file or COMPASS_NATS_PASSWORD"))
			}
			h, err := deploy.NATSPasswordHash(pw)
			if err != nil {
				return cli.UsageError(err)
			}
			_, err = fmt.Fprintln(in.Stdout, h)
			return err
		}
	},
}

// doorClient returns an HTTPS client for the door: HTTPS only (the token
// never crosses plaintext), HTTP/2 for gRPC, trusting the system roots plus
// caFile when set.
func doorClient(serverURL, caFile string) (*http.Client, error) {
	hc, err := doorhttp.Client(serverURL, caFile)
	switch {
	case errors.Is(err, doorhttp.ErrServerURL):
		return nil, cli.UsageError(err)
	case err != nil:
		return nil, fmt.Errorf("server: %w", err)
	}
	return hc, nil
}
