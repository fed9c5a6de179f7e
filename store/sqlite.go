package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/compass-runner/identity/verifier"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
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

func (s *sqliteStore) BootstrapTenant(ctx context.Context) (string, error) {
	var id string
	err := s.db.QueryRowContext(ctx, `SELECT id FROM tenants WHERE bootstrap = 1`).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("store: bootstrap tenant: %w", err)
	}
	return id, nil
}

func (s *sqliteStore) LookupTokenHash(ctx context.Context, hash [sha256.Size]byte) (verifier.MintedToken, error) {
	var (
		m                verifier.MintedToken
		kind             int
		revoked, expires sql.NullString
	)
	err := s.db.QueryRowContext(ctx,
		`SELECT id, subject_kind, subject_id, tenant_id, revoked_at, expires_at FROM tokens WHERE hash = ?`, hash[:]).
		Scan(&m.TokenID, &kind, &m.ID, &m.Tenant, &revoked, &expires)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return verifier.MintedToken{}, fmt.Errorf("store: %w", verifier.ErrTokenNotFound)
	case err != nil:
		return verifier.MintedToken{}, fmt.Errorf("store: lookup token: %w", err)
	}
	m.Kind = verifier.SubjectKind(kind)
	m.Revoked = revoked.Valid
	if m.ExpiresAt, err = parseTime(expires); err != nil {
		return verifier.MintedToken{}, fmt.Errorf("store: lookup token: %w", err)
	}
	return m, nil
}

func (s *sqliteStore) Mint(ctx context.Context, kind verifier.SubjectKind, id string, opts ...MintOption) (string, TokenInfo, error) {
	return mint(ctx, s, kind, id, opts)
}

func (s *sqliteStore) StoreTokenHash(ctx context.Context, token string, kind verifier.SubjectKind, id string, opts ...MintOption) (TokenInfo, error) {
	mo, err := checkStoredToken(token, kind, id, opts)
	if err != nil {
		return TokenInfo{}, err
	}
	pub, err := newPublicID()
	if err != nil {
		return TokenInfo{}, err
	}
	hash := verifier.HashToken(token)
	release, err := s.write(ctx)
	if err != nil {
		return TokenInfo{}, fmt.Errorf("store: store token: %w", err)
	}
	defer release()
	created := s.now()
	expires := mo.expiresAt(created)
	var expiresCol any // NULL: never expires
	if !expires.IsZero() {
		expiresCol = fmtTime(expires)
	}
	var tenant string
	err = s.db.QueryRowContext(ctx, `INSERT INTO tokens (id, hash, subject_kind, subject_id, tenant_id, created_at, expires_at)
		SELECT ?, ?, ?, ?, id, ?, ? FROM tenants WHERE bootstrap = 1
		RETURNING tenant_id`, pub, hash[:], int(kind), id, fmtTime(created), expiresCol).Scan(&tenant)
	switch {
	case isSQLiteUnique(err):
		return TokenInfo{}, fmt.Errorf("%w: a token with that hash is already stored", ErrConflict)
	case errors.Is(err, sql.ErrNoRows):
		return TokenInfo{}, errors.New("store: store token: no bootstrap tenant")
	case err != nil:
		return TokenInfo{}, fmt.Errorf("store: store token: %w", err)
	}
	return TokenInfo{ID: pub, Kind: kind, SubjectID: id, Tenant: tenant, CreatedAt: created, ExpiresAt: expires}, nil
}

func isSQLiteUnique(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && (se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

const sqliteTokenColumns = `id, subject_kind, subject_id, tenant_id, created_at, revoked_at, expires_at`

type scanner interface{ Scan(dest ...any) error }

func scanSQLiteToken(r scanner) (TokenInfo, error) {
	var (
		t                         TokenInfo
		kind                      int
		created, revoked, expires sql.NullString
	)
	if err := r.Scan(&t.ID, &kind, &t.SubjectID, &t.Tenant, &created, &revoked, &expires); err != nil {
		return TokenInfo{}, err
	}
	t.Kind = verifier.SubjectKind(kind)
	var err error
	if t.CreatedAt, err = parseTime(created); err != nil {
		return TokenInfo{}, err
	}
	if t.RevokedAt, err = parseTime(revoked); err != nil {
		return TokenInfo{}, err
	}
	if t.ExpiresAt, err = parseTime(expires); err != nil {
		return TokenInfo{}, err
	}
	return t, nil
}

func (s *sqliteStore) Revoke(ctx context.Context, tokenID string) (TokenInfo, error) {
	release, err := s.write(ctx)
	if err != nil {
		return TokenInfo{}, fmt.Errorf("store: revoke: %w", err)
	}
	defer release()
	// COALESCE keeps the first revocation time.
	t, err := scanSQLiteToken(s.db.QueryRowContext(ctx,
		`UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ? RETURNING `+sqliteTokenColumns,
		fmtTime(s.now()), tokenID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return TokenInfo{}, fmt.Errorf("%w: no token with ID %q", ErrNotFound, tokenID)
	case err != nil:
		return TokenInfo{}, fmt.Errorf("store: revoke token: %w", err)
	}
	return t, nil
}

func (s *sqliteStore) ListTokens(ctx context.Context) ([]TokenInfo, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sqliteTokenColumns+` FROM tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []TokenInfo
	for rows.Next() {
		t, err := scanSQLiteToken(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) CountRunnerTokenIDsWithSlash(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM tokens
		WHERE subject_kind = ? AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)
		AND instr(subject_id, '/') > 0`, int(verifier.SubjectRunner), fmtTime(s.now())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count runner token IDs with '/': %w", err)
	}
	return n, nil
}

func (s *sqliteStore) RecordEnrollment(ctx context.Context, e Enrollment) (EnrollResult, error) {
	if err := checkEnrollment(&e, s.opts.now); err != nil {
		return EnrollResult{}, err
	}
	at := fmtTime(e.At)
	release, err := s.write(ctx)
	if err != nil {
		return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
	}
	defer release()
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: holds the write lock throughout
	if err != nil {
		return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `INSERT INTO runners
		(id, tenant_id, method, cluster, node_name, node_uid, pod_name, pod_uid, version, hostname, first_enrolled_at, last_enrolled_at)
		SELECT ?, id, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM tenants WHERE bootstrap = 1
		ON CONFLICT (id) DO NOTHING`,
		e.RunnerID, e.Method, e.Cluster, e.NodeName, e.NodeUID, e.PodName, e.PodUID, e.Version, e.Hostname, at, at)
	if err != nil {
		return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
	}
	var out EnrollResult
	if n == 1 {
		out.FirstEnrollment = true
	} else {
		var prev string
		if err := tx.QueryRowContext(ctx, `SELECT node_uid FROM runners WHERE id = ?`, e.RunnerID).Scan(&prev); err != nil {
			return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE runners SET method = ?, cluster = ?, node_name = ?, node_uid = ?,
			pod_name = ?, pod_uid = ?, version = ?, hostname = ?, last_enrolled_at = ? WHERE id = ?`,
			e.Method, e.Cluster, e.NodeName, e.NodeUID, e.PodName, e.PodUID, e.Version, e.Hostname, at, e.RunnerID); err != nil {
			return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
		}
		out.PreviousNodeUID = prev
		out.NodeUIDChanged = nodeUIDChanged(prev, e.NodeUID)
	}
	if err := tx.Commit(); err != nil {
		return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) TouchRunner(ctx context.Context, runnerID string, at time.Time) error {
	if at.IsZero() {
		at = s.opts.now()
	}
	ts := fmtTime(at)
	release, err := s.write(ctx)
	if err != nil {
		return fmt.Errorf("store: touch runner: %w", err)
	}
	defer release()
	// max() only ever advances last_seen_at; the row count tells a missing Runner.
	res, err := s.db.ExecContext(ctx, `UPDATE runners SET last_seen_at = max(COALESCE(last_seen_at, ?), ?) WHERE id = ?`,
		ts, ts, runnerID)
	if err != nil {
		return fmt.Errorf("store: touch runner: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: touch runner: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: no runner %q", ErrNotFound, runnerID)
	}
	return nil
}

const sqliteRunnerColumns = `id, tenant_id, method, cluster, node_name, node_uid, pod_name, pod_uid,
	version, hostname, first_enrolled_at, last_enrolled_at, last_seen_at`

func scanSQLiteRunner(r scanner) (Runner, error) {
	var (
		rn                Runner
		first, last, seen sql.NullString
	)
	if err := r.Scan(&rn.ID, &rn.Tenant, &rn.Method, &rn.Cluster, &rn.NodeName, &rn.NodeUID, &rn.PodName, &rn.PodUID,
		&rn.Version, &rn.Hostname, &first, &last, &seen); err != nil {
		return Runner{}, err
	}
	var err error
	if rn.FirstEnrolledAt, err = parseTime(first); err != nil {
		return Runner{}, err
	}
	if rn.LastEnrolledAt, err = parseTime(last); err != nil {
		return Runner{}, err
	}
	if rn.LastSeenAt, err = parseTime(seen); err != nil {
		return Runner{}, err
	}
	return rn, nil
}

func (s *sqliteStore) GetRunner(ctx context.Context, runnerID string) (Runner, error) {
	rn, err := scanSQLiteRunner(s.db.QueryRowContext(ctx, `SELECT `+sqliteRunnerColumns+` FROM runners WHERE id = ?`, runnerID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Runner{}, fmt.Errorf("%w: no runner %q", ErrNotFound, runnerID)
	case err != nil:
		return Runner{}, fmt.Errorf("store: get runner: %w", err)
	}
	return rn, nil
}

func (s *sqliteStore) ListRunners(ctx context.Context) ([]Runner, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sqliteRunnerColumns+` FROM runners ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("store: list runners: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Runner
	for rows.Next() {
		rn, err := scanSQLiteRunner(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list runners: %w", err)
		}
		out = append(out, rn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list runners: %w", err)
	}
	return out, nil
}
