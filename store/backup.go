package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// ErrBackupUnsupported: Backup copies SQLite files only; a PostgreSQL
// database is backed up with pg_dump (docs/store.md).
var ErrBackupUnsupported = errors.New("store: backup: a PostgreSQL database is backed up with pg_dump -Fc and restored with pg_restore")

// backupSource is the path of the SQLite database a backup's URL names: a
// PostgreSQL URL is ErrBackupUnsupported, a path SQLite would misread is
// refused as Open refuses it.
func backupSource(url string) (string, error) {
	backend, path, err := parseURL(url)
	if err != nil {
		return "", err
	}
	if backend != "sqlite" {
		return "", ErrBackupUnsupported
	}
	if err := checkSQLitePath(path); err != nil {
		return "", err
	}
	return path, nil
}

// Backup copies the SQLite database a URL names into a new file at to, with
// SQLite's VACUUM INTO: a consistent snapshot taken inside one read
// transaction, so it is safe while a Server writes (WAL readers never block
// the writer). It neither migrates nor requires the current schema (a backup
// is what one takes before migrating) and returns the copy's schema version.
//
// to must not exist: it is created with mode 0600 (the copy holds the
// token hashes and the Runner registry, as the original does) and removed
// again if the copy fails. A missing database is ErrNoDatabase; a PostgreSQL
// URL is ErrBackupUnsupported.
//
// The copy is stamped as a backup taken now (WithClock sets the clock):
// OpenServing, which serve and compass-callout use, refuses it until
// Restore or Reconcile has re-applied the revocations made after it.
func Backup(ctx context.Context, url, to string, opts ...Option) (int, error) {
	path, err := backupSource(url)
	if err != nil {
		return 0, err
	}
	if to == "" {
		return 0, errors.New("store: backup: no file to back up to")
	}
	if err := sqliteExists(path); err != nil {
		return 0, err
	}
	// VACUUM INTO accepts an empty file: create it first, exclusively, so it
	// is 0600 and an existing file is never overwritten.
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	v, err := vacuumInto(ctx, path, to, buildOptions(opts).now())
	if err != nil {
		_ = os.Remove(to)
		return 0, err
	}
	return v, nil
}

// BackupTo writes a copy of the SQLite database a URL names to w, as Backup
// makes it (VACUUM INTO: consistent while a Server writes), and returns the
// copy's schema version. It is for a database whose host has no shell to
// fetch a file with (the Server's image): compass-server backup --to -
// streams it through kubectl exec.
//
// VACUUM INTO writes to a file, so the copy is first made in a file created
// 0600 beside the database, on the volume already sized for it: in the
// Server's pod /tmp is a small emptyDir, and outgrowing it gets the pod
// evicted, while a full data volume only fails this copy. The file is
// unlinked as soon as VACUUM INTO returns and read through its open
// descriptor, so it outlives the command only if the command is killed
// during VACUUM INTO (a .compass-backup-*.tmp file in the data directory).
// Nothing is written to w unless the copy was made whole. The copy is
// stamped as Backup's is.
func BackupTo(ctx context.Context, url string, w io.Writer, opts ...Option) (int, error) {
	path, err := backupSource(url)
	if err != nil {
		return 0, err
	}
	if err := sqliteExists(path); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".compass-backup-*.tmp")
	if err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	defer f.Close()
	tmp := f.Name()
	v, err := vacuumInto(ctx, path, tmp, buildOptions(opts).now())
	if rmErr := os.Remove(tmp); err == nil && rmErr != nil {
		err = fmt.Errorf("store: backup: %w", rmErr)
	}
	if err != nil {
		return 0, err
	}
	// The descriptor opened before VACUUM INTO sees what it wrote: the same
	// file, truncated and rewritten in place.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	if _, err := io.Copy(w, f); err != nil {
		return 0, fmt.Errorf("store: backup: write the copy: %w", err)
	}
	return v, nil
}

// vacuumInto copies the database at path into to, stamps the copy as a
// backup taken at takenAt and returns its schema version.
func vacuumInto(ctx context.Context, path, to string, takenAt time.Time) (int, error) {
	db, err := sql.Open("sqlite", fmt.Sprintf("%s?_busy_timeout=%d", path, sqliteBusyTimeout.Milliseconds()))
	if err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, to); err != nil {
		return 0, fmt.Errorf("store: backup: VACUUM INTO: %w", err)
	}
	cp, err := sql.Open("sqlite", fmt.Sprintf("%s?_busy_timeout=%d", to, sqliteBusyTimeout.Milliseconds()))
	if err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	defer cp.Close()
	cp.SetMaxOpenConns(1) // the journal mode changes only with no other connection
	var tables, v int
	if err := cp.QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&tables); err != nil {
		return 0, fmt.Errorf("store: backup: read the copy's schema version: %w", err)
	}
	if tables == 0 {
		return 0, nil // a database never migrated
	}
	if err := stampBackup(ctx, cp, takenAt); err != nil {
		return 0, err
	}
	if err := cp.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("store: backup: read the copy's schema version: %w", err)
	}
	return v, nil
}
