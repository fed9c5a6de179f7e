package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/deploy"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/internal/doorhttp"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

const mainUsage = `compass-server: the Compass Server. It owns the gRPC door Runners enroll
through (TLS only; minted tokens or Kubernetes projected tokens, DL-440), the
store of minted tokens and enrolled Runners, and the operator CLI.

Usage: compass-server <command> [flags] [args]

Commands:
%s
Every flag falls back to a COMPASS_* environment variable when not given
(--nats-url -> COMPASS_NATS_URL). "compass-server <command> --help" explains a
command and lists its flags.
`

// Env is how Main reads the environment (os.Getenv in main).
type Env func(string) string

// Main runs compass-server with args (without the program name) and returns
// the process exit code: 0 on success, 2 for a usage error, 1 otherwise.
func Main(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) int {
	cmds := commands()
	list := func() string {
		var b strings.Builder
		tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
		for _, c := range cmds {
			fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
		}
		_ = tw.Flush()
		return b.String()
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stderr, mainUsage, list())
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range cmds {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], getenv, stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, errHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintln(stderr, "compass-server:", err)
			return 2
		default:
			fmt.Fprintln(stderr, "compass-server:", err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "compass-server: unknown command %q\n\n"+mainUsage, args[0], list())
	return 2
}

// errUsage marks an error in how a command was called.
var errUsage = errors.New("usage")

type runnable struct {
	name, summary string
	run           func(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error
}

func usageErr(err error) error { return fmt.Errorf("%w: %w", errUsage, err) }

// storeFlags are the flags of every command that opens the store directly.
type storeFlags struct {
	databaseURL string
	dataDir     string
}

func (s *storeFlags) register(c *command) {
	c.fs.StringVar(&s.databaseURL, "database-url", "", "database: postgres://... (PostgreSQL) or sqlite://PATH; empty: SQLite at <data-dir>/compass.db")
	c.fs.StringVar(&s.dataDir, "data-dir", DefaultDataDir, "directory of the SQLite database when --database-url is empty")
}

// logFlags choose the log level.
type logFlags struct{ level string }

func (l *logFlags) register(c *command) {
	c.fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error (logs are structured, on stderr)")
}

func (l *logFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usageErr(fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level))
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv})), nil
}

// doorFlags are the flags of commands that call the Server's admin door.
type doorFlags struct {
	server    string
	caFile    string
	tokenFile string
}

func (d *doorFlags) register(c *command) {
	c.fs.StringVar(&d.server, "server", "", "the Server's door, https://HOST:PORT")
	c.envAs["server"] = "COMPASS_SERVER_URL" // as compass-runner names it
	c.fs.StringVar(&d.caFile, "ca-file", "", "PEM CA to trust for the door besides the system roots (dev: .data/ca.pem)")
	c.fs.StringVar(&d.tokenFile, "token-file", "", "file holding an account token (mint-account-token); or set COMPASS_TOKEN to the token itself")
}

// client returns an AdminService client and the account token.
func (d *doorFlags) client(getenv Env) (adminv1connect.AdminServiceClient, string, error) {
	if d.server == "" {
		return nil, "", usageErr(errors.New("--server (or COMPASS_SERVER_URL) is required"))
	}
	tok := getenv("COMPASS_TOKEN")
	if d.tokenFile != "" {
		if tok != "" {
			return nil, "", usageErr(errors.New("set either --token-file/COMPASS_TOKEN_FILE or COMPASS_TOKEN, not both"))
		}
		var err error
		if tok, err = readSecretFile(d.tokenFile); err != nil {
			return nil, "", err
		}
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

func commands() []runnable {
	return []runnable{
		{"serve", "run the Server: the TLS door, the store, last_seen from Runner events", runServe},
		{"dev", "run the whole stack in one process on loopback (NATS, callout, door, dev issuer)", runDev},
		{"mint-runner-token", "mint a token for a Runner outside Kubernetes; prints it once on stdout", runMintRunner},
		{"mint-account-token", "mint a token for an operator or automation account; prints it once on stdout", runMintAccount},
		{"revoke-token", "revoke a minted token by its public ID", runRevoke},
		{"list-tokens", "list minted tokens (public IDs, never a token or hash)", runListTokens},
		{"runners", "list enrolled Runners", runRunners},
		{"ping-runner", "ping a Runner over NATS through the Server's admin door", runPing},
		{"manifests", "print the Kubernetes manifests for Runner identity", runManifests},
	}
}

func runServe(ctx context.Context, args []string, getenv Env, _, stderr io.Writer) error {
	c := newCommand("serve", "", "", `Runs the Server until SIGINT/SIGTERM, then shuts down gracefully.

The door (compass.runner.v1.RunnerService for Runners, compass.admin.v1.AdminService
for accounts) speaks gRPC, gRPC-Web and Connect over TLS only. Runners present a
minted Runner token or, on a registered Kubernetes cluster, their projected
ServiceAccount token (audience compass-runner); both resolve through the same
verifier the NATS auth callout uses.

--runner-clusters names the cluster file (DL-440): the trust root for projected
tokens. Without it no cluster is trusted and only minted tokens work. With it, the
Server refuses to start while a live minted Runner token has "/" in its ID.

With --nats-url the Server connects to NATS as one of the callout's auth_users
(--nats-user and COMPASS_NATS_PASSWORD or --nats-password-file; or --nats-creds in
operator mode), answers ping-runner, and keeps each Runner's last_seen from its events.`, 0)
	var cfg ServeConfig
	var sf storeFlags
	var lf logFlags
	var passwordFile string
	sf.register(c)
	lf.register(c)
	c.fs.StringVar(&cfg.Listen, "listen", ":8443", "door address (TLS)")
	c.fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate chain of the door (required)")
	c.fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of the door (required)")
	c.fs.StringVar(&cfg.RunnerClusters, "runner-clusters", "", "cluster file registering Kubernetes clusters whose projected tokens are trusted")
	c.fs.StringVar(&cfg.NATS.URL, "nats-url", "", "NATS server(s) the Server connects to, comma-separated")
	c.fs.StringVar(&cfg.RunnerNATSURL, "runner-nats-url", "", "NATS URL Enroll tells Runners to use (default: --nats-url)")
	c.fs.StringVar(&cfg.NATS.User, "nats-user", "", "NATS user (server-config callout mode: one of auth_callout.auth_users)")
	c.fs.StringVar(&passwordFile, "nats-password-file", "", "file holding the NATS user's password (or set COMPASS_NATS_PASSWORD)")
	c.fs.StringVar(&cfg.NATS.Creds, "nats-creds", "", "NATS credentials file (operator mode)")
	c.fs.StringVar(&cfg.NATS.CAFile, "nats-ca-file", "", "PEM CA for a TLS NATS server")
	c.fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "address of the Prometheus /metrics listener (empty: none)")
	if _, err := c.parse(args, getenv, stderr); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	cfg.DatabaseURL, cfg.DataDir, cfg.Logger = sf.databaseURL, sf.dataDir, log
	cfg.NATS.Password = getenv("COMPASS_NATS_PASSWORD")
	if passwordFile != "" {
		if cfg.NATS.Password != "" {
			return usageErr(errors.New("set either --nats-password-file or COMPASS_NATS_PASSWORD, not both"))
		}
		if cfg.NATS.Password, err = readSecretFile(passwordFile); err != nil {
			return err
		}
	}
	return Serve(ctx, cfg)
}

func runDev(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error {
	c := newCommand("dev", "", "", `Runs the whole Compass stack in one process, on loopback, for trying it out:

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
throwaway: keys and passwords live in memory and change on every start.`, 0)
	var cfg DevConfig
	var lf logFlags
	lf.register(c)
	c.fs.StringVar(&cfg.DataDir, "data-dir", DefaultDataDir, "directory for the database, the dev CA and the token files")
	c.fs.StringVar(&cfg.Listen, "listen", DefaultDevListen, "door address (TLS, loopback)")
	c.fs.StringVar(&cfg.NATSListen, "nats-listen", DefaultDevNATSListen, "embedded nats-server address")
	if _, err := c.parse(args, getenv, stderr); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	cfg.Logger = log
	cfg.Out = stdout
	return Dev(ctx, cfg)
}

func mintCommand(name, idFlag, idHelp string, kind verifier.SubjectKind, help string) func(context.Context, []string, Env, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error {
		c := newCommand(name, "", "", help, 0)
		var sf storeFlags
		var id string
		sf.register(c)
		c.fs.StringVar(&id, idFlag, "", idHelp)
		if _, err := c.parse(args, getenv, stderr); err != nil {
			return err
		}
		if id == "" {
			return usageErr(fmt.Errorf("--%s is required", idFlag))
		}
		st, err := openStore(ctx, sf.databaseURL, sf.dataDir, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		tok, info, err := st.Mint(ctx, kind, id)
		if err != nil {
			if errors.Is(err, verifier.ErrInvalidArgument) {
				return usageErr(err)
			}
			return err
		}
		// The token alone on stdout, so it can be piped; the record on stderr.
		if _, err := fmt.Fprintln(stdout, tok); err != nil {
			return fmt.Errorf("server: write token: %w", err)
		}
		fmt.Fprintf(stderr, "minted %s token %s for %q; it is shown once and cannot be shown again (revoke with: compass-server revoke-token %s)\n",
			info.Kind, info.ID, info.SubjectID, info.ID)
		return nil
	}
}

var runMintRunner = mintCommand("mint-runner-token", "runner-id",
	`Runner ID: a single NATS subject token; "/" is reserved for Kubernetes Runner IDs (<cluster>/<node>)`,
	verifier.SubjectRunner, `Mints a token for a Runner that is not on Kubernetes and prints it once, alone on
stdout, so it can be piped into a secret store:

  compass-server mint-runner-token --runner-id build-01 > build-01.token

Only its SHA-256 is stored. The Runner presents it as COMPASS_RUNNER_TOKEN; the
token's public ID (printed on stderr, and by list-tokens) is what revoke-token takes.
A Runner ID may not contain "/", ".", "*", ">" or whitespace.`)

var runMintAccount = mintCommand("mint-account-token", "name",
	"account name: a single NATS subject token",
	verifier.SubjectAccount, `Mints a token for an operator or automation account and prints it once, alone on
stdout. Account tokens open the admin door (runners --server, ping-runner):

  compass-server mint-account-token --name ops > ops.token
  compass-server ping-runner --server https://compass:8443 --token-file ops.token RUNNER_ID

Only its SHA-256 is stored; revoke it with revoke-token and its public ID.`)

func runRevoke(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error {
	c := newCommand("revoke-token", "TOKEN_ID", "", `Revokes a minted token by its public ID (from list-tokens or the mint command's
stderr). From then on the token fails on the door and at the NATS callout alike.
Revoking a revoked token is not an error. A live stream opened before the
revocation keeps running (it authenticated when it opened).`, 1)
	var sf storeFlags
	sf.register(c)
	rest, err := c.parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, sf.databaseURL, sf.dataDir, nil)
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

func runListTokens(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error {
	c := newCommand("list-tokens", "", "", `Lists minted tokens, oldest first: public ID, kind, subject, created and revoked
times. It never prints a token or a hash (only hashes are stored).`, 0)
	var sf storeFlags
	sf.register(c)
	if _, err := c.parse(args, getenv, stderr); err != nil {
		return err
	}
	st, err := openStore(ctx, sf.databaseURL, sf.dataDir, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	infos, err := st.ListTokens(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tSUBJECT\tCREATED\tREVOKED")
	for _, i := range infos {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", i.ID, i.Kind, i.SubjectID, fmtTime(i.CreatedAt), fmtTime(i.RevokedAt))
	}
	return tw.Flush()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func runRunners(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error {
	c := newCommand("runners", "", "", `Lists enrolled Runners: ID, how each last authenticated (projected or minted),
its cluster, node and pod, first and last enrollment, and last seen (from its
events). Reads the database directly, or with --server asks the admin door
(AdminService.ListRunners) with an account token.`, 0)
	var sf storeFlags
	var df doorFlags
	sf.register(c)
	df.register(c)
	if _, err := c.parse(args, getenv, stderr); err != nil {
		return err
	}
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
		st, err := openStore(ctx, sf.databaseURL, sf.dataDir, nil)
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

func runPing(ctx context.Context, args []string, getenv Env, stdout, stderr io.Writer) error {
	c := newCommand("ping-runner", "RUNNER_ID", "", `Pings a Runner: the Server sends {"command":"ping"} to the Runner's NATS command
subject (compass.runner.<id>.cmd) and returns the Runner's answer and the
round-trip time. It goes through the Server's admin door with an account token:

  compass-server ping-runner --server https://127.0.0.1:8443 --ca-file .data/ca.pem \
    --token-file .data/admin-token dev/dev-node

The exit code is 0 when the Runner answered ok, 1 otherwise.`, 1)
	var df doorFlags
	df.register(c)
	rest, err := c.parse(args, getenv, stderr)
	if err != nil {
		return err
	}
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

func runManifests(ctx context.Context, args []string, _ Env, stdout, stderr io.Writer) error {
	err := deploy.ManifestsCommand(ctx, args, stdout, stderr)
	if errors.Is(err, errHelp) {
		return errHelp
	}
	return err
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
