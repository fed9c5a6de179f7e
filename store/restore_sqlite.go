package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// sqliteHeader opens every SQLite database file.
var sqliteHeader = []byte("SQLite format 3\x00")

// Restore puts the SQLite backup read from backup (a file compass-server
// backup made) in place of the database at url, and returns what it did.
//
// Nothing is half-written: the backup is copied into a temporary file beside
// the database, migrated to this binary's schema, reconciled with the
// database it replaces (every revocation that one holds and the backup lacks
// is re-applied, in one transaction that also clears the backup's stamp),
// synced, and only then renamed over the database. A failure at any step
// leaves the database as it was and removes the temporary file. The replaced
// file is kept beside it (RestoreReport.Kept), a hard link made before the
// rename.
//
// The database must not be in use: a Server or callout that has it open
// would go on with the old file and, with WAL, its -wal file would no
// longer match. Restore checks that its own connection was the last one
// (SQLite removes the -wal file only then) and fails with ErrDatabaseInUse
// otherwise. Without a database at url it fails with ErrNoReplacedDatabase
// unless o.AcceptLostRevocations (the database is lost). o.Replaced is
// ignored: the database replaced is the one at url. With o.DryRun it
// reports what it would do and leaves the database and its directory as
// they are.
func Restore(ctx context.Context, url string, backup io.Reader, o RestoreOptions) (RestoreReport, error) {
	backend, path, err := parseURL(url)
	if err != nil {
		return RestoreReport{}, err
	}
	if backend != "sqlite" {
		return RestoreReport{}, errors.New("store: restore: a PostgreSQL backup is restored with pg_restore into a new database, then reconciled (compass-server restore --from-database-url)")
	}
	if err := checkSQLitePath(path); err != nil {
		return RestoreReport{}, err
	}
	if err := o.check(); err != nil {
		return RestoreReport{}, err
	}

	// The replaced database first: refusing early costs nothing.
	var replaced []tokenState
	var replacedRunners map[string]bool
	compared := false
	switch err := sqliteExists(path); {
	case err == nil && o.RevokeEveryLiveToken:
		return RestoreReport{}, fmt.Errorf("store: restore: %s is there, so the revocations made after the backup are re-applied from it: "+
			"--revoke-every-live-token is for a database that is lost", path)
	case err == nil:
		if replaced, replacedRunners, err = readReplacedSQLite(ctx, path, !o.DryRun); err != nil {
			return RestoreReport{}, err
		}
		compared = true
	case errors.Is(err, ErrNoDatabase):
		if !o.AcceptLostRevocations && !o.RevokeEveryLiveToken {
			return RestoreReport{}, fmt.Errorf("%w: there is no database at %s, so the tokens revoked after the backup cannot be revoked again; "+
				"if it is lost, revoke every token live in the backup with --revoke-every-live-token, or accept that with --i-know-revocations-may-be-lost", ErrNoReplacedDatabase, path)
		}
	default:
		return RestoreReport{}, err
	}

	dir := filepath.Dir(path)
	tmpDir := dir
	if _, err := os.Stat(dir); o.DryRun && errors.Is(err, os.ErrNotExist) {
		tmpDir = "" // a dry run makes no data directory
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return RestoreReport{}, fmt.Errorf("store: restore: %w", err)
	}
	tmp, err := copyToTemp(tmpDir, backup)
	if err != nil {
		return RestoreReport{}, err
	}
	renamed := false
	defer func() {
		if !renamed {
			for _, p := range []string{tmp, tmp + "-wal", tmp + "-shm", tmp + "-journal"} {
				_ = os.Remove(p)
			}
		}
	}()

	rep, err := reconcileFile(ctx, tmp, replaced, replacedRunners, compared, o)
	if err != nil || o.DryRun {
		return rep, err
	}
	if err := syncFile(tmp); err != nil {
		return rep, err
	}
	if compared {
		kept := path + ".replaced-" + o.now().Format("20060102T150405Z")
		if err := os.Link(path, kept); err != nil {
			return rep, fmt.Errorf("store: restore: keep the replaced database: %w", err)
		}
		rep.Kept = kept
	}
	if err := os.Rename(tmp, path); err != nil {
		if rep.Kept != "" {
			_ = os.Remove(rep.Kept)
			rep.Kept = ""
		}
		return rep, fmt.Errorf("store: restore: %w", err)
	}
	renamed = true
	if err := syncDir(dir); err != nil {
		return rep, err
	}
	return rep, nil
}

// readReplacedSQLite reads the SQLite database about to be replaced and
// checks that nothing else has it open: after its own connection closes,
// SQLite checkpoints and removes the -wal file only if it held the last
// connection (it takes an exclusive lock on the file to know), so a -wal file
// still there means a Server or callout has it open.
func readReplacedSQLite(ctx context.Context, path string, checkInUse bool) ([]tokenState, map[string]bool, error) {
	toks, runners, err := readReplaced(ctx, "sqlite://"+path)
	if err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(path + "-wal"); checkInUse && err == nil {
		return nil, nil, fmt.Errorf("%w: %s is open in another process (its -wal file stays): stop compass-server serve and compass-callout first", ErrDatabaseInUse, path)
	}
	return toks, runners, nil
}

// copyToTemp copies backup into a new 0600 file in dir and checks that it is
// an SQLite database.
func copyToTemp(dir string, backup io.Reader) (string, error) {
	f, err := os.CreateTemp(dir, ".compass-restore-*.tmp")
	if err != nil {
		return "", fmt.Errorf("store: restore: %w", err)
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		_ = f.Close()
		_ = os.Remove(name)
		return "", err
	}
	if _, err := io.Copy(f, backup); err != nil {
		return fail(fmt.Errorf("store: restore: read the backup: %w", err))
	}
	head := make([]byte, len(sqliteHeader))
	if _, err := f.ReadAt(head, 0); err != nil || !bytes.Equal(head, sqliteHeader) {
		return fail(fmt.Errorf("%w: the backup is not an SQLite database", ErrNotADatabase))
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(name)
		return "", fmt.Errorf("store: restore: %w", err)
	}
	return name, nil
}

// reconcileFile migrates and reconciles the SQLite copy at path, and closes
// it (its -wal file checkpointed and removed).
func reconcileFile(ctx context.Context, path string, replaced []tokenState, replacedRunners map[string]bool, compared bool, o RestoreOptions) (RestoreReport, error) {
	st, err := openRestorable(ctx, "sqlite://"+path)
	if err != nil {
		return RestoreReport{}, err
	}
	rep, restored, restoredRunners, err := prepareRestored(ctx, st, o.DryRun)
	if err == nil {
		rep, err = reconcileWith(ctx, st, rep, restored, restoredRunners, replaced, replacedRunners, compared, o)
	}
	if cerr := st.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return rep, err
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store: restore: sync %s: %w", path, err)
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: restore: sync %s: %w", dir, err)
	}
	return nil
}

// The SQLite side of restorable.

func (s *sqliteStore) migrateNow(ctx context.Context) (int, error) { return s.migrate(ctx) }

func (s *sqliteStore) guard(ctx context.Context) (guardState, error) {
	var taken sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT backup_taken_at FROM restore_guard WHERE id = 1`).Scan(&taken)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return guardState{missing: true}, nil
	case err != nil:
		return guardState{}, fmt.Errorf("store: read the restore guard: %w", err)
	}
	t, err := parseTime(taken)
	if err != nil {
		return guardState{}, fmt.Errorf("store: read the restore guard: %w", err)
	}
	return guardState{backupTakenAt: t}, nil
}

func (s *sqliteStore) tokenStates(ctx context.Context) ([]tokenState, error) {
	var hasExpiry int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('tokens') WHERE name = 'expires_at'`).Scan(&hasExpiry); err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	expires := "NULL"
	if hasExpiry > 0 {
		expires = "expires_at"
	}
	rows, err := s.db.QueryContext(ctx, `SELECT hash, id, subject_kind, subject_id, tenant_id, created_at, revoked_at, `+expires+` FROM tokens`)
	if err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []tokenState
	for rows.Next() {
		var (
			ts   tokenState
			hash []byte
		)
		info, err := scanSQLiteToken(prefixScanner{rows, &hash})
		if err != nil {
			return nil, fmt.Errorf("store: read tokens: %w", err)
		}
		if len(hash) != len(ts.Hash) {
			return nil, fmt.Errorf("store: read tokens: token %s has a %d-byte hash", info.ID, len(hash))
		}
		copy(ts.Hash[:], hash)
		ts.Info = info
		out = append(out, ts)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	return out, nil
}

// prefixScanner scans one leading column into first, then hands the rest to
// a scanner written for the columns after it.
type prefixScanner struct {
	r     scanner
	first any
}

func (p prefixScanner) Scan(dest ...any) error { return p.r.Scan(append([]any{p.first}, dest...)...) }

func (s *sqliteStore) runnerIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM runners`)
	if err != nil {
		return nil, fmt.Errorf("store: read runners: %w", err)
	}
	defer func() { _ = rows.Close() }()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store: read runners: %w", err)
		}
		out[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read runners: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) reconcile(ctx context.Context, revs []tokenState, at time.Time) error {
	release, err := s.write(ctx)
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	defer release()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, r := range revs {
		if _, err := tx.ExecContext(ctx, `UPDATE tokens SET revoked_at = ? WHERE hash = ? AND revoked_at IS NULL`,
			fmtTime(r.Info.RevokedAt), r.Hash[:]); err != nil {
			return fmt.Errorf("store: restore: revoke token %s again: %w", r.Info.ID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO restore_guard (id, backup_taken_at, database_oid, restored_at) VALUES (1, NULL, NULL, ?)
		ON CONFLICT (id) DO UPDATE SET backup_taken_at = NULL, restored_at = excluded.restored_at`, fmtTime(at)); err != nil {
		return fmt.Errorf("store: restore: clear the backup stamp: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: restore: commit: %w", err)
	}
	return nil
}

func (s *sqliteStore) identity(ctx context.Context) (string, error) {
	var file string
	if err := s.db.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		return "", fmt.Errorf("store: restore: %w", err)
	}
	if real, err := filepath.EvalSymlinks(file); err == nil {
		file = real
	}
	return "sqlite:" + file, nil
}

// stampBackup marks the SQLite copy at db as a backup taken at takenAt, so
// that OpenServing refuses it until restore has reconciled it. A copy of a
// database older than migration 0004 has no guard and is left unmarked. The
// copy is switched to a rollback journal first, so it stays one file.
func stampBackup(ctx context.Context, db *sql.DB, takenAt time.Time) error {
	var tables int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'restore_guard'`).Scan(&tables); err != nil {
		return fmt.Errorf("store: backup: stamp the copy: %w", err)
	}
	if tables == 0 {
		return nil
	}
	if _, err := db.ExecContext(ctx, `PRAGMA journal_mode = DELETE`); err != nil {
		return fmt.Errorf("store: backup: stamp the copy: %w", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO restore_guard (id, backup_taken_at) VALUES (1, ?)
		ON CONFLICT (id) DO UPDATE SET backup_taken_at = excluded.backup_taken_at`, fmtTime(takenAt)); err != nil {
		return fmt.Errorf("store: backup: stamp the copy: %w", err)
	}
	return nil
}
