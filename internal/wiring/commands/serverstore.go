package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/internal/wiring/cli"
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

It is the one command that moves an existing schema (in a cluster: the Job
compass-server manifests --migrate-job renders). serve, check-schema (the Server
pod's init container) and the operator commands (mint-runner-token,
mint-account-token, revoke-token, list-tokens, runners) refuse a schema behind this
binary (back up, then run migrate) or ahead of it (upgrade this binary), and never
migrate; serve creates a new SQLite database only where there is no file. dev, whose
database is throwaway, migrates its own.`

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

const backupHelp = `Copies the SQLite database into --to FILE, which must not exist, with SQLite's
VACUUM INTO: a consistent snapshot in one read transaction, safe while serve runs.
The copy is created with mode 0600. It neither migrates nor needs the current
schema, so take it before compass-server migrate.

  compass-server backup --data-dir /var/lib/compass --to /backups/compass-$(date +%F).db

--to - writes the copy to stdout instead, for a host with no shell to fetch a
file from, such as the Server's pod (docs/store.md):

  kubectl -n compass-system exec compass-server-0 -- compass-server backup --to - > compass.db

The copy is made first in a .compass-backup-*.tmp file beside the database, then
streamed; the message goes to stderr. --to - refuses a terminal as stdout, and
with kubectl exec, -t (which would turn the bytes into terminal text).

--to-dir DIR (instead of --to) is a scheduled backup, as the CronJob that
compass-server manifests --backup-schedule renders runs it: the copy is
DIR/compass-<UTC time>.db, and then the oldest such copies beyond --keep are
removed (only files named so; retention runs once the new copy is whole).

  compass-server backup --data-dir /var/lib/compass --to-dir /backups --keep 7

The copy is stamped as a backup: serve and compass-callout refuse it until
compass-server restore has re-applied the revocations made after it (stop serve,
then compass-server restore --from FILE). A PostgreSQL database is backed up with
pg_dump --format=custom and restored with pg_restore, then compass-server restore
(docs/store.md); this command refuses a postgres:// URL.`

var backupCommand = &cli.Command{Name: "backup", Summary: "copy the SQLite database to a new file, or to stdout (consistent while serve runs)",
	Help: backupHelp,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var to, toDir string
		var keep int
		sf.register(fs)
		fs.StringVar(&to, "to", "", "file to write the copy to; must not exist; - for stdout (this or --to-dir)")
		fs.StringVar(&toDir, "to-dir", "", "directory to write compass-<UTC time>.db into, keeping the newest --keep copies (a scheduled backup)")
		fs.IntVar(&keep, "keep", 7, fmt.Sprintf("with --to-dir: how many copies to keep, the new one counted (%d to %d)", store.MinBackupKeep, store.MaxBackupKeep))
		return func(ctx context.Context, in *cli.Invocation) error {
			if (to == "") == (toDir == "") {
				return cli.UsageError(errors.New("give --to FILE (or - for stdout) or --to-dir DIR"))
			}
			u := server.DatabaseURL(sf.databaseURL, sf.dataDir)
			if toDir != "" {
				if keep < store.MinBackupKeep || keep > store.MaxBackupKeep {
					return in.BadValue("keep", fmt.Sprintf("want %d to %d copies", store.MinBackupKeep, store.MaxBackupKeep))
				}
				res, err := store.BackupToDir(ctx, u, toDir, keep)
				if err != nil {
					return fmt.Errorf("server: %w", err)
				}
				fmt.Fprintf(in.Stdout, "backed up %s (schema version %d) to %s\n", server.DescribeDatabase(u), res.SchemaVersion, res.File)
				for _, r := range res.Removed {
					fmt.Fprintf(in.Stdout, "removed the older copy %s (--keep %d)\n", r, keep)
				}
				return nil
			}
			if to == "-" || to == "/dev/stdout" {
				return backupToStdout(ctx, in, u)
			}
			v, err := store.Backup(ctx, u, to)
			if errors.Is(err, os.ErrExist) {
				return in.ValueError("to", "the file exists, and a backup never overwrites one: name a new file, or - for stdout", err)
			}
			if err != nil {
				return fmt.Errorf("server: %w", err)
			}
			fmt.Fprintf(in.Stdout, "backed up %s (schema version %d) to %s\n", server.DescribeDatabase(u), v, to)
			return nil
		}
	},
}

// backupToStdout is backup --to -: the copy's bytes alone on stdout, the
// message on stderr. A terminal is refused before anything is read: a
// database dumped on a screen is unreadable, and its token hashes and
// Runner registry would stay in the terminal's scrollback.
func backupToStdout(ctx context.Context, in *cli.Invocation, u string) error {
	if cli.IsTerminal(in.Stdout) {
		return in.BadValue("to", "stdout is a terminal: redirect it to a file (compass-server backup --to - > compass.db; with kubectl exec, leave out -t)")
	}
	v, err := store.BackupTo(ctx, u, in.Stdout)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	fmt.Fprintf(in.Stderr, "backed up %s (schema version %d) to stdout\n", server.DescribeDatabase(u), v)
	return nil
}

// ttlHelp is the --ttl flag's usage.
var ttlHelp = fmt.Sprintf("the token expires this long after it is minted (a Go duration: 8h, 720h; %s to %s); "+
	"without it the token never expires", store.MinTokenTTL, store.MaxTokenTTL)

// checkTTLFlag is --ttl's validation, in the terms of wherever it was set
// (--ttl or COMPASS_TTL).
func checkTTLFlag(in *cli.Invocation, ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return in.BadValue("ttl", "must be positive (leave --ttl out for a token that does not expire)")
	case ttl < store.MinTokenTTL:
		return in.BadValue("ttl", fmt.Sprintf("under the minimum of %s (the NATS user JWT a token is granted expires in whole seconds)", store.MinTokenTTL))
	case ttl > store.MaxTokenTTL:
		return in.BadValue("ttl", fmt.Sprintf("over the maximum of %s (366 days; longer is no safer than no expiry and more likely a mistyped unit: leave --ttl out and revoke the token instead)", store.MaxTokenTTL))
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
				if err := checkTTLFlag(in, ttl); err != nil {
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

var clearQuarantineCommand = &cli.Command{Name: "clear-quarantine", Summary: "let a quarantined Runner ID connect and enroll again",
	Help: `Ends the quarantine of a Runner ID (docs/self-host.md, "Duplicates and
quarantine"). compass-callout quarantines a Runner ID whose connections kept
displacing each other (--quarantine-after within --quarantine-window): a copied
token. From then on every connection of the ID is ended, its NATS connects are
refused and the door refuses its Enroll, until this command. runners lists the
quarantined IDs with both clients (host:port).

First stop the copy: revoke the copied minted token (revoke-token) and mint the
Runner a new one, or, for a Kubernetes Runner, find the other client. Cleared
while the copy still runs, the ping-pong starts again and quarantines the ID
again. The record is deleted, displacements included; compass-callout lets the
ID connect at its next --revocation-poll.

  compass-server clear-quarantine --runner-id build-01`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var id string
		sf.register(fs)
		fs.StringVar(&id, "runner-id", "", "the quarantined Runner ID (runners lists them)")
		return func(ctx context.Context, in *cli.Invocation) error {
			if id == "" {
				return cli.UsageError(errors.New("--runner-id is required"))
			}
			st, err := server.OpenStore(ctx, sf.databaseURL, sf.dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			q, err := st.ClearQuarantine(ctx, id)
			if err != nil {
				return fmt.Errorf("server: clear quarantine: %w", err)
			}
			fmt.Fprintf(in.Stdout, "cleared the quarantine of %q (since %s, %d displacements, last between %s and %s); compass-callout lets it connect at its next poll\n",
				q.RunnerID, fmtTime(q.QuarantinedAt), q.Displacements, q.NewerClient, q.OlderClient)
			return nil
		}
	},
}

var listTokensCommand = &cli.Command{Name: "list-tokens", Summary: "list minted tokens (public IDs, never a token or hash)",
	Help: `Lists minted tokens, oldest first: public ID, kind, subject, created, expiry
("-": never expires) and revocation times. It never prints a token or a hash
(only hashes are stored).

--output json prints the same records as one JSON object, for scripts
(docs/server.md, "Machine-readable output"):

  {"tokens": [{"id": "3f2a9c0d1e4b5a67", "kind": "runner", "subject": "build-01",
    "created_at": "2026-12-03T12:00:00Z", "expires_at": null, "revoked_at": null}]}

Times are RFC 3339 in UTC; a time that has not happened is null.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var output string
		sf.register(fs)
		registerOutput(fs, &output)
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
			if output == outputJSON {
				return writeJSON(stdout, tokensJSON(infos))
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

var runnersCommand = &cli.Command{Name: "runners", Summary: "list enrolled Runners", Env: doorEnv,
	Help: `Lists enrolled Runners: ID, how each last authenticated (projected or minted),
its cluster, node and pod, first and last enrollment, and last seen (from its
events). Reads the database directly, or with --server asks the admin door
(AdminService.ListRunners) with an account token.

--output json prints them as one JSON object, for scripts (docs/server.md,
"Machine-readable output"): {"runners": [...]}, each with id, method, cluster,
node_name, node_uid, pod_name, pod_uid, version, hostname, first_enrolled_at,
last_enrolled_at and last_seen_at. Times are RFC 3339 in UTC; a field with no
value (a minted Runner's cluster, a Runner never seen) is null.

It also lists the quarantined Runner IDs (DL-459; clear-quarantine), after
the Runners: since when, the displacements counted and
the last two clients (host:port); in JSON {"quarantined": [...]}, each with
runner_id, quarantined_at, displacements, newer_client and older_client.`,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var df doorFlags
		var output string
		sf.register(fs)
		df.register(fs)
		registerOutput(fs, &output)
		return func(ctx context.Context, in *cli.Invocation) error {
			getenv, stdout := in.Getenv, in.Stdout
			var rs []store.Runner
			var qs []store.Quarantine
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
				for _, q := range res.Msg.GetQuarantined() {
					qs = append(qs, quarantineFromProto(q))
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
				if qs, err = st.ListQuarantined(ctx); err != nil {
					return err
				}
			}
			if output == outputJSON {
				return writeJSON(stdout, runnersJSON(rs, qs))
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
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(qs) == 0 {
				return nil
			}
			fmt.Fprintln(stdout)
			tw = tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "QUARANTINED\tSINCE\tDISPLACEMENTS\tNEWER CLIENT\tOLDER CLIENT")
			for _, q := range qs {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", q.RunnerID, fmtTime(q.QuarantinedAt), q.Displacements, dash(q.NewerClient), dash(q.OlderClient))
			}
			return tw.Flush()
		}
	},
}
