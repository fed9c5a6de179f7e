package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/store"
)

// iKnowFlag is the flag that lets a restore go on without the database it
// replaces. Its name says what it costs.
const iKnowFlag = "i-know-revocations-may-be-lost"

// revokeAllFlag is the other answer to a lost replaced database: revoke every
// token live in the backup, so that none revoked after it comes back.
const revokeAllFlag = "revoke-every-live-token"

const restoreHelp = `Restores a backup without bringing back the tokens revoked after it was taken.
A restored database is refused by serve and compass-callout until this command
has re-applied, from the database it replaces, every revocation made after the
backup. Tokens minted after the backup are listed as lost (mint new ones); they
are never carried over. Only public token IDs and names are printed.

SQLite: stop serve (and compass-callout), then, with the database to be
replaced still in place:

  compass-server restore --data-dir /var/lib/compass --from /backups/compass-2026-12-01.db

The backup (- for stdin) is copied beside the database, migrated to this
release's schema, reconciled, synced and renamed over the database; the
replaced file is kept beside it as compass.db.replaced-<time>. A failure leaves
the database as it was. The command refuses a database another process has open.

PostgreSQL: pg_restore the dump into a new, empty database, then reconcile it
with the database it replaces, and point the Servers and callouts at it:

  compass-server restore --database-url "$NEW_DATABASE_URL" --from-database-url "$COMPASS_DATABASE_URL"

The revocations and the new database's stamp are written in one transaction.
The old database is only read. Run the command again after the move: it only
ever revokes, so it catches what was revoked in the old database meanwhile.

A backup already put in place by hand (SQLite) is reconciled the same way, with
--from-database-url naming the replaced file wherever it was kept.

--dry-run prints what the restore would do (the revocations it would re-apply,
the tokens that would be lost) and changes nothing; it may run beside serve.

When the replaced database is lost, --` + revokeAllFlag + ` restores it safely:
every token live in the backup is revoked in the same transaction, so none
revoked after the backup comes back; the command lists them, and each holder
needs a new one (mint-runner-token, mint-account-token; Runners on Kubernetes
use their projected tokens and need none). Or --` + iKnowFlag + ` lets the
restore go on: every token revoked after the backup is live again until it is
revoked anew. The command logs that as an error and lists the backup's live
tokens, to be checked one by one (docs/store.md, Backup and restore).`

var restoreCommand = &cli.Command{Name: "restore", Summary: "restore a backup, re-applying the revocations made after it; serve refuses a backup until then",
	Help: restoreHelp, Logs: true,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		var from, fromURL string
		var iKnow, revokeAll, dryRun bool
		sf.register(fs)
		fs.StringVar(&from, "from", "", "SQLite: the backup file to restore (from compass-server backup); - for stdin")
		fs.StringVar(&fromURL, "from-database-url", "", "the database the restored one replaces, whose revocations are re-applied: "+
			"PostgreSQL, the old database; SQLite, the replaced file when the backup is already in place")
		fs.BoolVar(&iKnow, iKnowFlag, false, "the replaced database is lost: restore anyway; tokens revoked after the backup are live again")
		fs.BoolVar(&revokeAll, revokeAllFlag, false, "the replaced database is lost: restore anyway, revoking every token live in the backup (mint new ones for their holders)")
		fs.BoolVar(&dryRun, "dry-run", false, "print what the restore would do and change nothing")
		return func(ctx context.Context, in *cli.Invocation) error {
			u := server.DatabaseURL(sf.databaseURL, sf.dataDir)
			backend, err := store.BackendOf(u)
			if err != nil {
				return cli.UsageError(fmt.Errorf("server: restore: %w", err))
			}
			o := store.RestoreOptions{Replaced: fromURL, AcceptLostRevocations: iKnow, RevokeEveryLiveToken: revokeAll, DryRun: dryRun}
			var rep store.RestoreReport
			switch {
			case iKnow && revokeAll:
				return cli.UsageError(fmt.Errorf("server: restore: --%s and --%s are two answers to a lost database: choose one", revokeAllFlag, iKnowFlag))
			case fromURL != "" && (iKnow || revokeAll):
				return cli.UsageError(fmt.Errorf("server: restore: --from-database-url names the replaced database, whose revocations are re-applied: --%s and --%s are for a lost one", revokeAllFlag, iKnowFlag))
			case from != "" && backend != "sqlite":
				return cli.UsageError(errors.New("server: restore: --from takes an SQLite backup file; restore a PostgreSQL dump with pg_restore into a new database, then run restore --database-url NEW --from-database-url OLD"))
			case from != "" && fromURL != "":
				return cli.UsageError(errors.New("server: restore: --from compares with the database it replaces, at --data-dir or --database-url: leave --from-database-url out"))
			case from != "":
				rep, err = restoreFile(ctx, u, from, o)
			case fromURL == "" && !iKnow && !revokeAll:
				return cli.UsageError(fmt.Errorf("server: restore: nothing to re-apply the revocations from: give --from BACKUP_FILE (SQLite), "+
					"or --from-database-url with the database the restored one replaces; if that database is lost, --%s (or --%s)", revokeAllFlag, iKnowFlag))
			default:
				rep, err = store.Reconcile(ctx, u, o)
			}
			if err != nil {
				return fmt.Errorf("server: restore: %w", err)
			}
			if !rep.Compared && !dryRun && revokeAll {
				in.Log.Warn("server: restored without the replaced database: every token live in the backup is revoked",
					"database", server.DescribeDatabase(u), "backup_taken_at", rep.BackupTakenAt, "revoked_tokens", len(rep.RevokedLive))
			} else if !rep.Compared && !dryRun {
				in.Log.Error("server: restored without the replaced database: every token revoked after the backup is live again until revoked anew",
					"database", server.DescribeDatabase(u), "backup_taken_at", rep.BackupTakenAt, "live_tokens", len(rep.Unchecked))
			}
			return printRestore(in.Stdout, server.DescribeDatabase(u), rep, dryRun)
		}
	},
}

// restoreFile is restore --from: the SQLite backup file, or stdin.
func restoreFile(ctx context.Context, u, from string, o store.RestoreOptions) (store.RestoreReport, error) {
	var r io.Reader = os.Stdin
	if from == "-" && cli.IsTerminal(os.Stdin) {
		// Nothing to read but what is typed: refuse rather than wait.
		return store.RestoreReport{}, errors.New("--from -: stdin is a terminal: redirect the backup into it (compass-server restore --from - < compass-backup.db)")
	}
	if from != "-" {
		f, err := os.Open(from)
		if err != nil {
			return store.RestoreReport{}, err
		}
		defer f.Close()
		if same(f, strings.TrimPrefix(strings.TrimPrefix(u, "sqlite://"), "sqlite:")) {
			return store.RestoreReport{}, fmt.Errorf("--from %s is the database itself: to reconcile a backup already in place, leave --from out and give --from-database-url with the replaced file", from)
		}
		r = f
	}
	return store.Restore(ctx, u, r, o)
}

// same reports whether f is the file at path.
func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// printRestore says what the restore did, by public token IDs and names.
func printRestore(w io.Writer, db string, rep store.RestoreReport, dryRun bool) error {
	taken := "a backup"
	if !rep.BackupTakenAt.IsZero() {
		taken += " taken at " + fmtTime(rep.BackupTakenAt)
	}
	verb := map[bool]string{false: "restored", true: "dry run, nothing changed: would restore"}[dryRun]
	fmt.Fprintf(w, "%s %s from %s (schema version %d", verb, db, taken, rep.SchemaFrom)
	if want := store.SchemaVersionWanted(); rep.SchemaFrom != want {
		fmt.Fprintf(w, ", migrated to %d", want)
	}
	fmt.Fprintln(w, ")")
	if rep.Kept != "" {
		fmt.Fprintf(w, "the replaced database is kept at %s\n", rep.Kept)
	}
	table := func(ts []store.TokenInfo, when string, at func(store.TokenInfo) time.Time) {
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintf(tw, "  ID\tKIND\tSUBJECT\t%s\n", when)
		for _, t := range ts {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.ID, t.Kind, t.SubjectID, fmtTime(at(t)))
		}
		_ = tw.Flush()
	}
	if !rep.Compared && rep.RevokedLive != nil {
		fmt.Fprintf(w, "NOT compared with the replaced database (--%s): %s the %d tokens live in the backup; mint new ones for their holders (Runners on Kubernetes need none):\n",
			revokeAllFlag, map[bool]string{false: "revoked", true: "would revoke"}[dryRun], len(rep.RevokedLive))
		table(rep.RevokedLive, "CREATED", func(t store.TokenInfo) time.Time { return t.CreatedAt })
		return nil
	}
	if !rep.Compared {
		fmt.Fprintf(w, "NOT compared with the replaced database (--%s): %d live tokens in the backup; revoke again every one revoked after the backup (compass-server revoke-token ID):\n",
			iKnowFlag, len(rep.Unchecked))
		table(rep.Unchecked, "CREATED", func(t store.TokenInfo) time.Time { return t.CreatedAt })
		return nil
	}
	fmt.Fprintf(w, "%s %d revocations made after the backup\n", map[bool]string{false: "re-applied", true: "would re-apply"}[dryRun], len(rep.Reapplied))
	if len(rep.Reapplied) > 0 {
		table(rep.Reapplied, "REVOKED", func(t store.TokenInfo) time.Time { return t.RevokedAt })
	}
	fmt.Fprintf(w, "%d tokens minted after the backup %s lost (they no longer resolve: mint new ones for their holders)\n", len(rep.Lost), map[bool]string{false: "are", true: "would be"}[dryRun])
	if len(rep.Lost) > 0 {
		table(rep.Lost, "CREATED", func(t store.TokenInfo) time.Time { return t.CreatedAt })
	}
	if rep.RunnersLost > 0 {
		fmt.Fprintf(w, "%d Runners enrolled after the backup are not in it: each is recorded again at its next enrollment\n", rep.RunnersLost)
	}
	return nil
}
