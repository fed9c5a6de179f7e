package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/internal/cli"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// storeFlags are the flags of every command that opens the store directly.
type storeFlags struct {
	databaseURL string
	dataDir     string
}

func (s *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.databaseURL, "database-url", "", "database: postgres://... (PostgreSQL) or sqlite://PATH; empty: SQLite at <data-dir>/compass.db")
	fs.StringVar(&s.dataDir, "data-dir", server.DefaultDataDir, "directory of the SQLite database when --database-url is empty")
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
			u := server.DatabaseURL(sf.databaseURL, sf.dataDir)
			res, err := store.Migrate(ctx, u)
			if err != nil {
				return fmt.Errorf("server: migrate: %w", err)
			}
			if res.From == res.To {
				fmt.Fprintf(in.Stdout, "%s is at schema version %d: nothing to migrate\n", server.DescribeDatabase(u), res.To)
				return nil
			}
			fmt.Fprintf(in.Stdout, "migrated %s from schema version %d to %d\n", server.DescribeDatabase(u), res.From, res.To)
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
				return cli.UsageError(errors.New("--to is required"))
			}
			u := server.DatabaseURL(sf.databaseURL, sf.dataDir)
			v, err := store.Backup(ctx, u, to)
			if err != nil {
				return fmt.Errorf("server: %w", err)
			}
			fmt.Fprintf(in.Stdout, "backed up %s (schema version %d) to %s\n", server.DescribeDatabase(u), v, to)
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
		return cli.UsageError(fmt.Errorf("--ttl %s: must be positive (leave --ttl out for a token that does not expire)", ttl))
	case ttl < store.MinTokenTTL:
		return cli.UsageError(fmt.Errorf("--ttl %s: under the minimum of %s (the NATS user JWT a token is granted expires in whole seconds)", ttl, store.MinTokenTTL))
	case ttl > store.MaxTokenTTL:
		return cli.UsageError(fmt.Errorf("--ttl %s: over the maximum of %s (366 days; longer is no safer than no expiry and more likely a mistyped unit: leave --ttl out and revoke the token instead)", ttl, store.MaxTokenTTL))
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
				return cli.UsageError(fmt.Errorf("--%s is required", idFlag))
			}
			// Bad input is refused before the database is opened.
			if err := verifier.CheckSubjectID(kind, id); err != nil {
				return cli.UsageError(fmt.Errorf("server: --%s: %w", idFlag, err))
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
			st, err := server.OpenStore(ctx, sf.databaseURL, sf.dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			tok, info, err := st.Mint(ctx, kind, id, opts...)
			if err != nil {
				if errors.Is(err, verifier.ErrInvalidArgument) {
					return cli.UsageError(err)
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
			st, err := server.OpenStore(ctx, sf.databaseURL, sf.dataDir)
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
			st, err := server.OpenStore(ctx, sf.databaseURL, sf.dataDir)
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
				st, err := server.OpenStore(ctx, sf.databaseURL, sf.dataDir)
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
