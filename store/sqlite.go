package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// sqliteBusyTimeout is how long a connection waits for another writer before
// SQLITE_BUSY. Writes here are single rows in short transactions, so a wait
// this long only happens under a pile-up that a caller should see as an error.
const sqliteBusyTimeout = 5 * time.Second

// sqliteMaxConns caps the pool. WAL lets readers run beside the one writer;
// more connections than this would only queue on the write lock.
const sqliteMaxConns = 8

// sqliteTimeLayout is how times are stored: fixed width, so they sort as text.
const sqliteTimeLayout = "2006-01-02T15:04:05.000000Z"

type sqliteStore struct {
	db   *sql.DB
	opts options
	// writers queues this process's writes in arrival order. SQLite has one
	// writer at a time, and its busy handler is a sleep-and-retry lottery:
	// under a burst (a fleet enrolling at once) an unlucky writer can lose it
	// past the busy timeout. Queuing here leaves the busy timeout to other
	// processes on the same file (the CLI beside a running Server).
	writers chan struct{}
}

// write takes this process's write slot, or gives up when ctx ends.
func (s *sqliteStore) write(ctx context.Context) (release func(), err error) {
	select {
	case s.writers <- struct{}{}:
		return func() { <-s.writers }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// OpenSQLite opens (creating it if needed) the SQLite database at path and
// applies pending migrations. The file's directory is created with mode 0700
// and a new file with mode 0600. Connections use WAL, a busy timeout,
// foreign keys, full synchronous commits (a revocation survives a power cut)
// and BEGIN IMMEDIATE transactions (so a transaction that reads then writes
// never fails to upgrade its lock).
func OpenSQLite(ctx context.Context, path string, opts ...Option) (Store, error) {
	st, _, err := openSQLite(ctx, path, modeMigrate, opts)
	return st, err
}

// checkSQLitePath refuses paths that are not one shared file.
func checkSQLitePath(path string) error {
	switch {
	case path == "":
		return fmt.Errorf("%w: empty SQLite path", ErrInvalidURL)
	case path == ":memory:" || strings.HasPrefix(path, "file::memory:"):
		return fmt.Errorf("%w: an in-memory SQLite database is not shared between connections; use a file", ErrInvalidURL)
	case strings.ContainsAny(path, "?#"):
		return fmt.Errorf("%w: SQLite path %q may not contain '?' or '#'", ErrInvalidURL, path)
	}
	return nil
}

// sqliteExists checks that the database file is there, for the callers that
// never create one.
func sqliteExists(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w at %s: run compass-server migrate to create it", ErrNoDatabase, path)
	case err != nil:
		return fmt.Errorf("store: open sqlite: %w", err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("store: open sqlite: %s is not a regular file", path)
	}
	return nil
}

func openSQLite(ctx context.Context, path string, mode openMode, opts []Option) (Store, int, error) {
	if err := checkSQLitePath(path); err != nil {
		return nil, 0, err
	}
	if mode != modeMigrate {
		// Stat, then open: a file removed in between would be recreated
		// empty by the driver, and then refused below as version 0.
		if err := sqliteExists(path); err != nil {
			return nil, 0, err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, 0, fmt.Errorf("store: open sqlite: %w", err)
		}
		// Create the file ourselves so that it is not world-readable.
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, 0, fmt.Errorf("store: open sqlite: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, 0, fmt.Errorf("store: open sqlite: %w", err)
		}
	}
	o := buildOptions(opts)
	dsn := fmt.Sprintf("%s?_busy_timeout=%d&_journal_mode=WAL&_foreign_keys=1&_txlock=immediate",
		path, sqliteBusyTimeout.Milliseconds())
	if o.readOnly {
		if mode == modeMigrate {
			return nil, 0, errReadOnlyMigrate
		}
		// A file: URI, so SQLite applies mode=ro ('?' and '#' are refused
		// above; a '%' is escaped). The writer (serve) set WAL; a read-only
		// connection cannot, and its transactions begin deferred: IMMEDIATE
		// takes the write lock.
		dsn = fmt.Sprintf("file:%s?mode=ro&_busy_timeout=%d&_foreign_keys=1&_txlock=deferred",
			strings.ReplaceAll(path, "%", "%25"), sqliteBusyTimeout.Milliseconds())
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, 0, fmt.Errorf("store: open sqlite: %w", err)
	}
	db.SetMaxOpenConns(sqliteMaxConns)
	db.SetMaxIdleConns(sqliteMaxConns)
	s := &sqliteStore{db: db, opts: o, writers: make(chan struct{}, 1)}
	var from int
	switch mode {
	case modeCurrent:
		err = s.checkCurrent(ctx)
	case modeMigrate:
		from, err = s.migrate(ctx)
	}
	if err != nil {
		_ = db.Close()
		return nil, 0, err
	}
	return s, from, nil
}

// checkCurrent refuses a database not at exactly the wanted version,
// without writing to it.
func (s *sqliteStore) checkCurrent(ctx context.Context) error {
	ms, err := loadMigrations("sqlite")
	if err != nil {
		return err
	}
	var tables int
	if err := s.db.QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&tables); err != nil {
		return fmt.Errorf("store: open sqlite: read version: %w", err)
	}
	found := 0
	if tables > 0 {
		if found, err = s.SchemaVersion(ctx); err != nil {
			return err
		}
	}
	return checkCurrent("sqlite", found, len(ms))
}

func (s *sqliteStore) Backend() string { return "sqlite" }

func (s *sqliteStore) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("store: close sqlite: %w", err)
	}
	return nil
}

func (s *sqliteStore) now() time.Time { return normTime(s.opts.now()) }

func fmtTime(t time.Time) string { return normTime(t).Format(sqliteTimeLayout) }

func parseTime(s sql.NullString) (time.Time, error) {
	if !s.Valid {
		return time.Time{}, nil
	}
	t, err := time.Parse(sqliteTimeLayout, s.String)
	if err != nil {
		return time.Time{}, fmt.Errorf("store: stored time %q: %w", s.String, err)
	}
	return t, nil
}

// migrate applies pending migrations and returns the version it found. The
// whole check-and-apply runs in one BEGIN IMMEDIATE transaction, so
// concurrent Opens of one file serialize on SQLite's write lock and each
// migration is applied once.
func (s *sqliteStore) migrate(ctx context.Context) (int, error) {
	ms, err := migrationsUpTo("sqlite", s.opts.migrateUpTo)
	if err != nil {
		return 0, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: migrate sqlite: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	current, err := applyMigrations(ctx, sqliteMigrationTx{tx}, migrationDialect{
		backend:       "sqlite",
		appliedAtType: "TEXT",
		record:        `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		appliedAt:     func() any { return fmtTime(s.now()) },
	}, ms)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: migrate sqlite: commit: %w", err)
	}
	return current, nil
}

// sqliteMigrationTx is a database/sql transaction as applyMigrations uses
// it.
type sqliteMigrationTx struct{ tx *sql.Tx }

func (t sqliteMigrationTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}

func (t sqliteMigrationTx) queryInt(ctx context.Context, query string) (n int, err error) {
	err = t.tx.QueryRowContext(ctx, query).Scan(&n)
	return n, err
}

func (s *sqliteStore) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("store: schema version: %w", err)
	}
	return v, nil
}
