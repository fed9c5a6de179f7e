package server

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/deploy"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/internal/cli"
	"github.com/compass-runner/identity/internal/doorhttp"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

const mainHelp = `The Compass Server. It owns the gRPC door Runners enroll through (TLS only;
minted tokens or Kubernetes projected tokens, DL-440), the store of minted
tokens and enrolled Runners, and the operator CLI.`

// Env is how Main reads the environment (os.Getenv in main).
type Env func(string) string

// Program is compass-server and its commands.
func Program() *cli.Command {
	return &cli.Command{Name: "compass-server", Help: mainHelp, Subcommands: []*cli.Command{
		serveCommand, devCommand, migrateCommand, backupCommand, mintRunnerCommand, mintAccountCommand, revokeCommand,
		listTokensCommand, runnersCommand, pingCommand, manifestsCommand,
	}}
}

// Main runs compass-server with args (without the program name) and returns
// the process exit code: 0 on success, 2 for a usage error, 1 otherwise.
func Main(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) int {
	return cli.Run(ctx, Program(), args, getenv, stdout, stderr)
}

func usageErr(err error) error { return cli.UsageError(err) }

// storeFlags are the flags of every command that opens the store directly.
type storeFlags struct {
	databaseURL string
	dataDir     string
}

func (s *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.databaseURL, "database-url", "", "database: postgres://... (PostgreSQL) or sqlite://PATH; empty: SQLite at <data-dir>/compass.db")
	fs.StringVar(&s.dataDir, "data-dir", DefaultDataDir, "directory of the SQLite database when --database-url is empty")
}

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
func (d *doorFlags) client(getenv Env) (adminv1connect.AdminServiceClient, string, error) {
	if d.server == "" {
		return nil, "", usageErr(errors.New("--server (or COMPASS_SERVER) is required"))
	}
	tok, err := cli.Secret(getenv, "token-file", d.tokenFile, "COMPASS_TOKEN")
	if err != nil {
		return nil, "", err
	}
	if tok == "" {
		return nil, "", usageErr(errors.New("an account token is required: --token-file or COMPASS_TOKEN"))
	}
	hc, err := DoorClient(d.server, d.caFile)
	if err != nil {
		return nil, "", err
	}
	return adminv1connect.NewAdminServiceClient(hc, d.server, connect.WithGRPC()), tok, nil
}

var serveCommand = &cli.Command{Name: "serve", Summary: "run the Server: the TLS door, the store, last_seen from Runner events", Logs: true, Env: []cli.EnvVar{{Name: "COMPASS_NATS_PASSWORD", Usage: "password of --nats-user (or --nats-password-file)"}},
	Help: `Runs the Server until SIGINT/SIGTERM, then shuts down gracefully.

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
operator mode), answers ping-runner, and keeps each Runner's last_seen from its events.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var cfg ServeConfig
		var sf storeFlags
		var passwordFile string
		sf.register(fs)
		fs.StringVar(&cfg.Listen, "listen", ":8443", "door address (TLS)")
		fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate chain of the door (required)")
		fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of the door (required)")
		fs.StringVar(&cfg.RunnerClusters, "runner-clusters", "", "cluster file registering Kubernetes clusters whose projected tokens are trusted")
		fs.StringVar(&cfg.NATS.URL, "nats-url", "", "NATS server(s) the Server connects to, comma-separated")
		fs.StringVar(&cfg.RunnerNATSURL, "runner-nats-url", "", "NATS URL(s) Enroll tells Runners to use, without credentials (default: --nats-url without its user part)")
		fs.StringVar(&cfg.NATS.User, "nats-user", "", "NATS user (server-config callout mode: one of auth_callout.auth_users)")
		fs.StringVar(&passwordFile, "nats-password-file", "", "file holding the NATS user's password (or set COMPASS_NATS_PASSWORD)")
		fs.StringVar(&cfg.NATS.Creds, "nats-creds", "", "NATS credentials file (operator mode)")
		fs.StringVar(&cfg.NATS.CAFile, "nats-ca-file", "", "PEM CA for a TLS NATS server")
		fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "address of the Prometheus /metrics listener (empty: none)")
		return func(ctx context.Context, in *cli.Invocation) error {
			var err error
			cfg.DatabaseURL, cfg.DataDir, cfg.Logger = sf.databaseURL, sf.dataDir, in.Log
			if cfg.NATS.Password, err = cli.Secret(in.Getenv, "nats-password-file", passwordFile, "COMPASS_NATS_PASSWORD"); err != nil {
				return err
			}
			return Serve(ctx, cfg)
		}
	},
}

var devCommand = &cli.Command{Name: "dev", Summary: "run the whole stack in one process on loopback (NATS, callout, door, dev issuer)", Logs: true,
	Help: `Runs the whole Compass stack in one process, on loopback, for trying it out:

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
--nats-listen) are free: a second dev on the same ports fails at once, naming the
taken port, and leaves the first one's CA, tokens and database alone.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var cfg DevConfig
		fs.StringVar(&cfg.DataDir, "data-dir", DefaultDataDir, "directory for the database, the dev CA and the token files")
		fs.StringVar(&cfg.Listen, "listen", DefaultDevListen, "door address (TLS, loopback)")
		fs.StringVar(&cfg.NATSListen, "nats-listen", DefaultDevNATSListen, "embedded nats-server address")
		return func(ctx context.Context, in *cli.Invocation) error {
			cfg.Logger, cfg.Out = in.Log, in.Stdout
			return Dev(ctx, cfg)
		}
	},
}

const migrateHelp = `Applies the pending schema migrations to the database and says from which schema
version to which. It creates the SQLite database when there is none; run again,
it has nothing to do. Migrations run in one transaction (PostgreSQL: under an
advisory lock), so two at once apply each migration once.

Upgrading (docs/store.md): back up the database (compass-server backup for SQLite,
pg_dump for PostgreSQL), run the new release's compass-server migrate once, then
roll the Servers and callouts onto the new release.

The operator commands (mint-runner-token, mint-account-token, revoke-token,
list-tokens, runners) never create or migrate a database: they refuse one whose
schema is behind this binary (run migrate) or ahead of it (upgrade this binary).
serve migrates an SQLite database on start; on PostgreSQL it refuses to start
until migrate has run.`

var migrateCommand = &cli.Command{Name: "migrate", Summary: "apply pending schema migrations; says from which version to which", Help: migrateHelp,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		sf.register(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			u := databaseURL(sf.databaseURL, sf.dataDir)
			res, err := store.Migrate(ctx, u)
			if err != nil {
				return fmt.Errorf("server: migrate: %w", err)
			}
			if res.From == res.To {
				fmt.Fprintf(in.Stdout, "%s is at schema version %d: nothing to migrate\n", describeDatabase(u), res.To)
				return nil
			}
			fmt.Fprintf(in.Stdout, "migrated %s from schema version %d to %d\n", describeDatabase(u), res.From, res.To)
			return nil
		}
	},
}

var backupCommand = &cli.Command{Name: "backup", Summary: "copy the SQLite database to a new file (consistent while serve runs)",
	Help: `Copies the SQLite database into --to FILE, which must not exist, with SQLite's
VACUUM INTO: a consistent snapshot in one read transaction, safe while serve runs.
The copy is created with mode 0600. It neither migrates nor needs the current
schema, so take it before compass-server migrate.

  compass-server backup --data-dir /var/lib/compass --to /backups/compass-$(date +%F).db

Restore: stop serve, replace <data-dir>/compass.db with the copy and remove
compass.db-wal and compass.db-shm beside it, then start serve. A PostgreSQL
database is backed up with pg_dump --format=custom and restored with pg_restore
(docs/store.md); this command refuses a postgres:// URL.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var to string
		sf.register(fs)
		fs.StringVar(&to, "to", "", "file to write the copy to; must not exist (required)")
		return func(ctx context.Context, in *cli.Invocation) error {
			if to == "" {
				return usageErr(errors.New("--to is required"))
			}
			u := databaseURL(sf.databaseURL, sf.dataDir)
			v, err := store.Backup(ctx, u, to)
			if err != nil {
				return fmt.Errorf("server: %w", err)
			}
			fmt.Fprintf(in.Stdout, "backed up %s (schema version %d) to %s\n", describeDatabase(u), v, to)
			return nil
		}
	},
}

// ttlHelp is the --ttl flag's usage.
var ttlHelp = fmt.Sprintf("the token expires this long after it is minted (a Go duration: 8h, 720h; %s to %s); "+
	"without it the token never expires", store.MinTokenTTL, store.MaxTokenTTL)

// checkTTLFlag is --ttl's validation, in the flag's terms.
func checkTTLFlag(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return usageErr(fmt.Errorf("--ttl %s: must be positive (leave --ttl out for a token that does not expire)", ttl))
	case ttl < store.MinTokenTTL:
		return usageErr(fmt.Errorf("--ttl %s: under the minimum of %s (the NATS user JWT a token is granted expires in whole seconds)", ttl, store.MinTokenTTL))
	case ttl > store.MaxTokenTTL:
		return usageErr(fmt.Errorf("--ttl %s: over the maximum of %s (366 days; longer is no safer than no expiry and more likely a mistyped unit: leave --ttl out and revoke the token instead)", ttl, store.MaxTokenTTL))
	}
	return nil
}

// secondMintHelp says what minting twice for one ID does (store.Store.Mint).
const secondMintHelp = `Minting again for an ID that already has a token does not replace it: the new
token is added beside the old one, under its own public ID, and both stay valid
until each is revoked or expires. To rotate: mint the new token, put it in place,
then revoke-token the old public ID (list-tokens shows both).`

// ttlDocHelp says what --ttl does.
const ttlDocHelp = `With --ttl the token expires that long after it is minted: from then on the door
and the NATS callout refuse it as they refuse an unknown token, and a NATS
connection made with it is granted a user JWT that ends no later than the
expiry. list-tokens shows the expiry. Without --ttl the token never expires.`

func mintCommand(name, summary, idFlag, idHelp string, kind verifier.SubjectKind, help string) *cli.Command {
	return &cli.Command{Name: name, Summary: summary, Help: help + "\n\n" + ttlDocHelp + "\n\n" + secondMintHelp, Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var id string
		var ttl time.Duration
		sf.register(fs)
		fs.StringVar(&id, idFlag, "", idHelp)
		fs.DurationVar(&ttl, "ttl", 0, ttlHelp)
		return func(ctx context.Context, in *cli.Invocation) error {
			if id == "" {
				return usageErr(fmt.Errorf("--%s is required", idFlag))
			}
			// Bad input is refused before the database is opened.
			if err := verifier.CheckSubjectID(kind, id); err != nil {
				return usageErr(fmt.Errorf("server: --%s: %w", idFlag, err))
			}
			var opts []store.MintOption
			fs.Visit(func(f *flag.Flag) {
				if f.Name == "ttl" {
					opts = append(opts, store.WithTTL(ttl))
				}
			})
			if len(opts) > 0 {
				if err := checkTTLFlag(ttl); err != nil {
					return err
				}
			}
			st, err := openStore(ctx, sf.databaseURL, sf.dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			tok, info, err := st.Mint(ctx, kind, id, opts...)
			if err != nil {
				if errors.Is(err, verifier.ErrInvalidArgument) {
					return usageErr(err)
				}
				return err
			}
			// The token alone on stdout, so it can be piped; the record on stderr.
			if _, err := fmt.Fprintln(in.Stdout, tok); err != nil {
				return fmt.Errorf("server: write token: %w", err)
			}
			expires := "it does not expire"
			if !info.ExpiresAt.IsZero() {
				expires = "it expires at " + fmtTime(info.ExpiresAt)
			}
			fmt.Fprintf(in.Stderr, "minted %s token %s for %q; %s; it is shown once and cannot be shown again (revoke with: compass-server revoke-token %s)\n",
				info.Kind, info.ID, info.SubjectID, expires, info.ID)
			return nil
		}
	}}
}

var mintRunnerCommand = mintCommand("mint-runner-token", "mint a token for a Runner outside Kubernetes; prints it once on stdout", "runner-id",
	`Runner ID: a single NATS subject token; "/" is reserved for Kubernetes Runner IDs (<cluster>/<node>)`,
	verifier.SubjectRunner, `Mints a token for a Runner that is not on Kubernetes and prints it once, alone on
stdout, so it can be piped into a secret store:

  compass-server mint-runner-token --runner-id build-01 > build-01.token

Only its SHA-256 is stored. The Runner presents it as COMPASS_RUNNER_TOKEN; the
token's public ID (printed on stderr, and by list-tokens) is what revoke-token takes.
A Runner ID may not contain "/", ".", "*", ">" or whitespace.`)

var mintAccountCommand = mintCommand("mint-account-token", "mint a token for an operator or automation account; prints it once on stdout", "name",
	"account name: a single NATS subject token",
	verifier.SubjectAccount, `Mints a token for an operator or automation account and prints it once, alone on
stdout. Account tokens open the admin door (runners --server, ping-runner):

  compass-server mint-account-token --name ops > ops.token
  compass-server ping-runner --server https://compass:8443 --token-file ops.token RUNNER_ID

Only its SHA-256 is stored; revoke it with revoke-token and its public ID.`)

var revokeCommand = &cli.Command{Name: "revoke-token", Summary: "revoke a minted token by its public ID", Args: "TOKEN_ID", NArgs: 1,
	Help: `Revokes a minted token by its public ID (from list-tokens or the mint command's
stderr). From then on the token fails on the door and at the NATS callout alike.
Revoking a revoked token is not an error. The door checks the token on every
call (it has no streaming RPC); a NATS connection the token opened before is
ended by compass-callout, which reads the store every --revocation-poll (with
--no-kick it lasts until its user JWT expires).`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		sf.register(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			stdout, rest := in.Stdout, in.Args
			st, err := openStore(ctx, sf.databaseURL, sf.dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			info, err := st.Revoke(ctx, rest[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "revoked %s token %s for %q at %s\n", info.Kind, info.ID, info.SubjectID, info.RevokedAt.Format(time.RFC3339))
			return nil
		}
	},
}

var listTokensCommand = &cli.Command{Name: "list-tokens", Summary: "list minted tokens (public IDs, never a token or hash)",
	Help: `Lists minted tokens, oldest first: public ID, kind, subject, created, expiry
("-": never expires) and revocation times. It never prints a token or a hash
(only hashes are stored).`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		sf.register(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			stdout := in.Stdout
			st, err := openStore(ctx, sf.databaseURL, sf.dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			infos, err := st.ListTokens(ctx)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKIND\tSUBJECT\tCREATED\tEXPIRES\tREVOKED")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", i.ID, i.Kind, i.SubjectID, fmtTime(i.CreatedAt), fmtTime(i.ExpiresAt), fmtTime(i.RevokedAt))
			}
			return tw.Flush()
		}
	},
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

var runnersCommand = &cli.Command{Name: "runners", Summary: "list enrolled Runners", Env: doorEnv,
	Help: `Lists enrolled Runners: ID, how each last authenticated (projected or minted),
its cluster, node and pod, first and last enrollment, and last seen (from its
events). Reads the database directly, or with --server asks the admin door
(AdminService.ListRunners) with an account token.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var df doorFlags
		sf.register(fs)
		df.register(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			getenv, stdout := in.Getenv, in.Stdout
			var rs []store.Runner
			if df.server != "" {
				client, tok, err := df.client(getenv)
				if err != nil {
					return err
				}
				req := connect.NewRequest(&adminv1.ListRunnersRequest{})
				req.Header().Set("Authorization", "Bearer "+tok)
				res, err := client.ListRunners(ctx, req)
				if err != nil {
					return fmt.Errorf("server: list runners: %w", err)
				}
				for _, r := range res.Msg.GetRunners() {
					rs = append(rs, runnerFromProto(r))
				}
			} else {
				st, err := openStore(ctx, sf.databaseURL, sf.dataDir)
				if err != nil {
					return err
				}
				defer st.Close()
				if rs, err = st.ListRunners(ctx); err != nil {
					return err
				}
			}
			tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tMETHOD\tCLUSTER\tNODE\tPOD\tVERSION\tHOSTNAME\tFIRST ENROLLED\tLAST ENROLLED\tLAST SEEN")
			dash := func(s string) string {
				if s == "" {
					return "-"
				}
				return s
			}
			for _, r := range rs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Method, dash(r.Cluster), dash(r.NodeName), dash(r.PodName),
					dash(r.Version), dash(r.Hostname), fmtTime(r.FirstEnrolledAt), fmtTime(r.LastEnrolledAt), fmtTime(r.LastSeenAt))
			}
			return tw.Flush()
		}
	},
}

func runnerFromProto(r *adminv1.Runner) store.Runner {
	t := func(ts interface{ AsTime() time.Time }, set bool) time.Time {
		if !set {
			return time.Time{}
		}
		return ts.AsTime()
	}
	return store.Runner{ID: r.GetId(), Method: r.GetMethod(), Cluster: r.GetCluster(), NodeName: r.GetNodeName(),
		NodeUID: r.GetNodeUid(), PodName: r.GetPodName(), PodUID: r.GetPodUid(),
		Version: r.GetVersion(), Hostname: r.GetHostname(),
		FirstEnrolledAt: t(r.GetFirstEnrolled(), r.GetFirstEnrolled() != nil),
		LastEnrolledAt:  t(r.GetLastEnrolled(), r.GetLastEnrolled() != nil),
		LastSeenAt:      t(r.GetLastSeen(), r.GetLastSeen() != nil)}
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
		helmValues := fs.Bool("nats-helm-values", false, deploy.NATSHelmValuesUsage)
		return func(ctx context.Context, in *cli.Invocation) error {
			render := deploy.Render
			if *helmValues {
				render = deploy.RenderNATSHelmValues
			}
			out, err := render(*p)
			if err != nil {
				return usageErr(err)
			}
			if _, err := in.Stdout.Write(out); err != nil {
				return fmt.Errorf("server: manifests: write: %w", err)
			}
			return nil
		}
	},
}

// DoorClient returns an HTTPS client for the door: HTTPS only (the token
// never crosses plaintext), HTTP/2 for gRPC, trusting the system roots plus
// caFile when set.
func DoorClient(serverURL, caFile string) (*http.Client, error) {
	hc, err := doorhttp.Client(serverURL, caFile)
	switch {
	case errors.Is(err, doorhttp.ErrServerURL):
		return nil, usageErr(err)
	case err != nil:
		return nil, fmt.Errorf("server: %w", err)
	}
	return hc, nil
}
