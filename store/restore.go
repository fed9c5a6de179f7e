package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"time"
)

// The restore guard (migration 0004, docs/store.md "Backup and restore").
//
// The attacker model: a token is revoked because it leaked. A backup taken
// before that revocation still holds the token live, so putting the backup in
// place of the database, by hand or by a restore that only copies, would make
// the leaked token work again at both doors without anyone deciding so. The
// guard makes that impossible to do silently:
//
//   - compass-server backup stamps its copy (restore_guard.backup_taken_at);
//     on PostgreSQL the row holds the OID of the database the schema was made
//     in, which pg_dump carries along, so a dump restored into a new database
//     names another database;
//   - OpenServing, which serve and compass-callout use, refuses such a
//     database (an *UnrestoredError wrapping ErrUnrestoredBackup);
//   - Restore and Reconcile clear the stamp only after re-applying, in the
//     same transaction, every revocation the replaced database holds that the
//     backup does not, or when the operator has said the replaced database is
//     lost (RestoreOptions.AcceptLostRevocations), which the caller logs.
//
// Revocations are the one thing carried from the replaced database into the
// restored one: each only makes the restored database stricter. A token minted
// after the backup is reported, never carried over: the replaced database may
// be the damaged or tampered one the backup is restoring from.

var (
	// ErrUnrestoredBackup: the database is a backup (or a copy of another
	// database) that compass-server restore has not reconciled with the
	// database it replaces; serve and compass-callout refuse it.
	ErrUnrestoredBackup = errors.New("store: the database is a backup not yet restored")

	// ErrNoReplacedDatabase: restore has no database to take the later
	// revocations from, and the operator has not accepted losing them.
	ErrNoReplacedDatabase = errors.New("store: restore: no replaced database to re-apply revocations from")

	// ErrDatabaseInUse: the SQLite database to be replaced is open in another
	// process (serve, compass-callout): restore replaces it only when stopped.
	ErrDatabaseInUse = errors.New("store: restore: the database is in use")

	// ErrNotADatabase: the backup is not a database this store made.
	ErrNotADatabase = errors.New("store: restore: not a compass database")
)

// UnrestoredError says why a database is refused for serving and what to run.
// It wraps ErrUnrestoredBackup.
type UnrestoredError struct {
	Backend string
	// BackupTakenAt is when compass-server backup took the copy (SQLite);
	// zero for a PostgreSQL database restored from a dump.
	BackupTakenAt time.Time
}

func (e *UnrestoredError) Error() string {
	if e.Backend == "postgres" {
		return "store: the postgres database is a copy of another database (a pg_dump restored into it) that compass-server restore has not reconciled: " +
			"tokens revoked in the original after the dump would be live again. Run compass-server restore --database-url <this database> --from-database-url <the original>; " +
			"if the original is lost, compass-server restore --database-url <this database> --i-know-revocations-may-be-lost (docs/store.md, Backup and restore)"
	}
	return fmt.Sprintf("store: the sqlite database is a backup taken at %s that compass-server restore has not reconciled: "+
		"tokens revoked after the backup would be live again. Put the database it replaced back and run compass-server restore --from <backup file>; "+
		"if that database is lost, run compass-server restore --i-know-revocations-may-be-lost on this one (docs/store.md, Backup and restore)",
		e.BackupTakenAt.UTC().Format(time.RFC3339))
}

func (e *UnrestoredError) Unwrap() error { return ErrUnrestoredBackup }

// guardState is the restore guard's row as a backend reads it.
type guardState struct {
	missing       bool      // no row: refused like a backup
	backupTakenAt time.Time // zero: not a backup copy
	oidMismatch   bool      // PostgreSQL: stamped in another database
}

// tokenState is a token as restore compares them: by hash, the token's
// identity. The hash is never printed; Info is.
type tokenState struct {
	Info TokenInfo
	Hash [sha256.Size]byte
}

// restorable is what Restore and Reconcile need of a backend beyond Store.
type restorable interface {
	Store
	guard(ctx context.Context) (guardState, error)
	// tokenStates reads every token with its hash, at any schema from 1 on.
	tokenStates(ctx context.Context) ([]tokenState, error)
	// runnerIDs reads every Runner ID.
	runnerIDs(ctx context.Context) (map[string]bool, error)
	// reconcile revokes each token of revs (by hash, at its RevokedAt) that
	// is live, clears the backup stamp, stamps the database's own identity
	// and restored_at, all in one transaction.
	reconcile(ctx context.Context, revs []tokenState, at time.Time) error
	// identity names the database for the same-database check.
	identity(ctx context.Context) (string, error)
	// migrateNow applies pending migrations and returns the version found.
	migrateNow(ctx context.Context) (int, error)
}

// OpenServing opens the store a URL names for serving (compass-server serve,
// compass-callout): as OpenCurrent does, and it also refuses a backup that
// compass-server restore has not reconciled (*UnrestoredError, wrapping
// ErrUnrestoredBackup). The operator commands use OpenCurrent, so a copy can
// still be read (list-tokens) and restored.
func OpenServing(ctx context.Context, url string, opts ...Option) (Store, error) {
	st, _, err := open(ctx, url, modeCurrent, opts)
	if err != nil {
		return nil, err
	}
	if err := checkGuard(ctx, st); err != nil {
		_ = st.Close()
		return nil, err
	}
	return st, nil
}

// checkGuard refuses a store whose guard says it is an unrestored backup.
func checkGuard(ctx context.Context, st Store) error {
	r, ok := st.(restorable)
	if !ok {
		return fmt.Errorf("store: %s backend has no restore guard", st.Backend())
	}
	g, err := r.guard(ctx)
	if err != nil {
		return err
	}
	if g.missing || g.oidMismatch || !g.backupTakenAt.IsZero() {
		return &UnrestoredError{Backend: st.Backend(), BackupTakenAt: g.backupTakenAt}
	}
	return nil
}

// RestoreOptions configure Restore and Reconcile.
type RestoreOptions struct {
	// Replaced is the URL of the database the restored one replaces, whose
	// revocations are re-applied. Restore (SQLite) compares with the file it
	// replaces and ignores it; Reconcile needs it unless
	// AcceptLostRevocations.
	Replaced string
	// AcceptLostRevocations lets the restore go on without a replaced
	// database (it is lost): tokens revoked after the backup are live again
	// until revoked anew. RestoreReport.Unchecked lists the backup's live
	// tokens; the caller logs the choice loudly.
	AcceptLostRevocations bool
	// RevokeEveryLiveToken lets the restore go on without a replaced
	// database by revoking every token live in the backup, in the same
	// transaction that clears the stamp: nothing revoked after the backup
	// comes back, and every holder of a minted token needs a new one
	// (RestoreReport.RevokedLive lists them). Runners on Kubernetes present
	// projected tokens, which the store does not hold, and are not touched.
	RevokeEveryLiveToken bool
	// Now is the clock restored_at is stamped with; time.Now when nil.
	Now func() time.Time
	// DryRun works out the report and changes nothing: the restored
	// database is neither migrated nor reconciled, an SQLite backup is
	// only copied to a temporary file (removed), and a database in use is
	// not refused, since nothing replaces it.
	DryRun bool
}

// guardVersion is the migration that made restore_guard: a database
// before it has no stamp to read.
const guardVersion = 4

// check refuses options that contradict each other.
func (o RestoreOptions) check() error {
	switch {
	case o.AcceptLostRevocations && o.RevokeEveryLiveToken:
		return errors.New("store: restore: revoking every live token and accepting lost revocations are two answers to a lost database: choose one")
	case o.Replaced != "" && (o.AcceptLostRevocations || o.RevokeEveryLiveToken):
		return errors.New("store: restore: a replaced database is named, so its revocations are re-applied: the answers to a lost one do not apply")
	}
	return nil
}

func (o RestoreOptions) now() time.Time {
	if o.Now != nil {
		return normTime(o.Now())
	}
	return normTime(time.Now())
}

// RestoreReport says what a restore did. It holds public token records only.
type RestoreReport struct {
	Backend string
	// BackupTakenAt is when compass-server backup took the copy; zero when
	// the copy carries no stamp (a pg_dump, or a backup older than 0004).
	BackupTakenAt time.Time
	// SchemaFrom is the restored copy's schema version as found; the
	// restore migrated it to SchemaVersionWanted.
	SchemaFrom int
	// Compared: the replaced database was read and its revocations
	// re-applied. False only with AcceptLostRevocations.
	Compared bool
	// Reapplied are the tokens revoked in the replaced database and live in
	// the backup, revoked again (RevokedAt is the original revocation).
	Reapplied []TokenInfo
	// Lost are the tokens live in the replaced database that the backup does
	// not hold (minted after it): they no longer resolve; mint new ones.
	Lost []TokenInfo
	// Unchecked, without a replaced database, are the backup's live tokens:
	// any of them revoked after the backup is live again.
	Unchecked []TokenInfo
	// RevokedLive, with RevokeEveryLiveToken, are the backup's live tokens,
	// every one revoked (RevokedAt is the restore's time).
	RevokedLive []TokenInfo
	// RunnersLost counts Runners the replaced database knew and the backup
	// does not; each is recorded again at its next enrollment.
	RunnersLost int
	// Kept is where Restore kept the replaced SQLite file ("" when there was
	// none).
	Kept string
}

// compare works out what the restored database lacks of the replaced one.
func compare(restored, replaced []tokenState, restoredRunners, replacedRunners map[string]bool, now time.Time) (revs []tokenState, rep RestoreReport) {
	have := make(map[[sha256.Size]byte]TokenInfo, len(restored))
	for _, t := range restored {
		have[t.Hash] = t.Info
	}
	for _, old := range replaced {
		cur, ok := have[old.Hash]
		switch {
		case !ok:
			// Minted after the backup. One revoked or expired since needs
			// nothing; a live one is lost.
			if !old.Info.Revoked() && !old.Info.Expired(now) {
				rep.Lost = append(rep.Lost, old.Info)
			}
		case old.Info.Revoked() && !cur.Revoked():
			revs = append(revs, old)
			cur.RevokedAt = old.Info.RevokedAt
			rep.Reapplied = append(rep.Reapplied, cur)
		}
	}
	for id := range replacedRunners {
		if !restoredRunners[id] {
			rep.RunnersLost++
		}
	}
	sortTokens(rep.Reapplied)
	sortTokens(rep.Lost)
	return revs, rep
}

func sortTokens(ts []TokenInfo) {
	sort.Slice(ts, func(i, j int) bool {
		if !ts[i].CreatedAt.Equal(ts[j].CreatedAt) {
			return ts[i].CreatedAt.Before(ts[j].CreatedAt)
		}
		return ts[i].ID < ts[j].ID
	})
}

// liveTokens are the tokens neither revoked nor expired at now.
func liveTokens(ts []tokenState, now time.Time) []TokenInfo {
	var out []TokenInfo
	for _, t := range ts {
		if !t.Info.Revoked() && !t.Info.Expired(now) {
			out = append(out, t.Info)
		}
	}
	sortTokens(out)
	return out
}

// openRestorable opens url as is (never creating, migrating or checking it).
func openRestorable(ctx context.Context, url string) (restorable, error) {
	st, _, err := open(ctx, url, modeAsIs, nil)
	if err != nil {
		return nil, err
	}
	r, ok := st.(restorable)
	if !ok {
		_ = st.Close()
		return nil, fmt.Errorf("store: restore: %s backend cannot be restored", st.Backend())
	}
	return r, nil
}

// readReplaced reads the tokens and Runner IDs of the replaced database at
// url, at whatever schema it is, without writing to it.
func readReplaced(ctx context.Context, url string) ([]tokenState, map[string]bool, error) {
	old, err := openRestorable(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("store: restore: open the replaced database: %w", err)
	}
	defer old.Close()
	toks, err := old.tokenStates(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("store: restore: read the replaced database: %w", err)
	}
	runners, err := old.runnerIDs(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("store: restore: read the replaced database: %w", err)
	}
	return toks, runners, nil
}

// prepareRestored checks that st holds a compass schema this binary can run,
// migrates it, and reads its stamp, tokens and Runners.
func prepareRestored(ctx context.Context, st restorable, dryRun bool) (RestoreReport, []tokenState, map[string]bool, error) {
	rep := RestoreReport{Backend: st.Backend()}
	v, err := st.SchemaVersion(ctx)
	if err != nil || v == 0 {
		return rep, nil, nil, fmt.Errorf("%w: it has no schema_migrations table or no migration applied", ErrNotADatabase)
	}
	rep.SchemaFrom = v
	if dryRun {
		if v > SchemaVersionWanted() {
			return rep, nil, nil, &SchemaError{Backend: st.Backend(), Found: v, Wanted: SchemaVersionWanted()}
		}
	} else if rep.SchemaFrom, err = st.migrateNow(ctx); err != nil {
		return rep, nil, nil, err
	}
	var g guardState
	if v >= guardVersion || !dryRun {
		if g, err = st.guard(ctx); err != nil {
			return rep, nil, nil, err
		}
	}
	rep.BackupTakenAt = g.backupTakenAt
	toks, err := st.tokenStates(ctx)
	if err != nil {
		return rep, nil, nil, fmt.Errorf("store: restore: read the restored database: %w", err)
	}
	runners, err := st.runnerIDs(ctx)
	if err != nil {
		return rep, nil, nil, fmt.Errorf("store: restore: read the restored database: %w", err)
	}
	return rep, toks, runners, nil
}

// reconcileWith finishes a restore on st, whose tokens and Runners are
// restored and restoredRunners: with the replaced database's (replaced not
// nil) the later revocations are re-applied; without, the operator accepted
// losing them. Either way the stamp is cleared in the same transaction.
func reconcileWith(ctx context.Context, st restorable, rep RestoreReport, restored []tokenState, restoredRunners map[string]bool,
	replaced []tokenState, replacedRunners map[string]bool, compared bool, o RestoreOptions) (RestoreReport, error) {
	now := o.now()
	var revs []tokenState
	if compared {
		var diff RestoreReport
		revs, diff = compare(restored, replaced, restoredRunners, replacedRunners, now)
		rep.Compared = true
		rep.Reapplied, rep.Lost, rep.RunnersLost = diff.Reapplied, diff.Lost, diff.RunnersLost
	} else if o.RevokeEveryLiveToken {
		rep.RevokedLive = []TokenInfo{} // none live is still an answer
		for _, t := range restored {
			if !t.Info.Revoked() && !t.Info.Expired(now) {
				t.Info.RevokedAt = now
				revs = append(revs, t)
				rep.RevokedLive = append(rep.RevokedLive, t.Info)
			}
		}
		sortTokens(rep.RevokedLive)
	} else {
		rep.Unchecked = liveTokens(restored, now)
	}
	if o.DryRun {
		return rep, nil
	}
	if err := st.reconcile(ctx, revs, now); err != nil {
		return rep, err
	}
	return rep, nil
}

// Reconcile restores the database at url in place: the database a backup was
// restored into (PostgreSQL: a pg_restore into a new database; SQLite: a
// copy already put in place). It migrates it to this binary's schema,
// re-applies every revocation of the replaced database at o.Replaced that it
// lacks, reports the tokens minted after the backup, and clears the restore
// guard, so that OpenServing accepts it; the revocations and the guard are
// written in one transaction, so a failure leaves the database refused as it
// was. The replaced database is only read.
//
// Without o.Replaced it needs o.AcceptLostRevocations (ErrNoReplacedDatabase).
// Reconcile may be run again at any time: it only ever revokes, so running it
// once more after the Servers moved to the restored database catches what
// was revoked in the old one meanwhile.
func Reconcile(ctx context.Context, url string, o RestoreOptions) (RestoreReport, error) {
	if err := o.check(); err != nil {
		return RestoreReport{}, err
	}
	if o.Replaced == "" && !o.AcceptLostRevocations && !o.RevokeEveryLiveToken {
		return RestoreReport{}, fmt.Errorf("%w: name it (--from-database-url), or if it is lost revoke every token live in the backup (--revoke-every-live-token) or accept that revocations made after the backup are undone (--i-know-revocations-may-be-lost)", ErrNoReplacedDatabase)
	}
	st, err := openRestorable(ctx, url)
	if err != nil {
		return RestoreReport{}, err
	}
	defer st.Close()
	var replaced []tokenState
	var replacedRunners map[string]bool
	if o.Replaced != "" {
		if err := checkDistinct(ctx, st, o.Replaced); err != nil {
			return RestoreReport{}, err
		}
		if replaced, replacedRunners, err = readReplaced(ctx, o.Replaced); err != nil {
			return RestoreReport{}, err
		}
	}
	rep, restored, restoredRunners, err := prepareRestored(ctx, st, o.DryRun)
	if err != nil {
		return rep, err
	}
	return reconcileWith(ctx, st, rep, restored, restoredRunners, replaced, replacedRunners, o.Replaced != "", o)
}

// checkDistinct refuses a replaced database that is the restored one: its
// revocations are the restored database's own, and nothing would be
// compared.
func checkDistinct(ctx context.Context, st restorable, replacedURL string) error {
	old, err := openRestorable(ctx, replacedURL)
	if err != nil {
		return fmt.Errorf("store: restore: open the replaced database: %w", err)
	}
	defer old.Close()
	a, err := st.identity(ctx)
	if err != nil {
		return err
	}
	b, err := old.identity(ctx)
	if err != nil {
		return err
	}
	if a == b {
		return errors.New("store: restore: the replaced database is the restored database itself: name the database that served before the restore")
	}
	return nil
}
