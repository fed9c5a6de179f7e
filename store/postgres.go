package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/compass-runner/identity/verifier"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgMigrateLockKey is the advisory lock that serializes migrations between
// Servers and callouts opening one database at once ("compass" in ASCII).
const pgMigrateLockKey int64 = 0x636f6d70617373

// pgUnlockTimeout bounds releasing the migration lock after the caller's
// context ended; past it the connection is closed, which releases it too.
const pgUnlockTimeout = 5 * time.Second

// pgUniqueViolation is SQLSTATE unique_violation.
const pgUniqueViolation = "23505"

type pgStore struct {
	pool *pgxpool.Pool
	opts options
}

// OpenPostgres connects to the PostgreSQL database at url (postgres:// or
// postgresql://, any libpq parameter, e.g. search_path to use a schema) and
// applies pending migrations under an advisory lock, so concurrent Opens
// against one database are safe.
func OpenPostgres(ctx context.Context, url string, opts ...Option) (Store, error) {
	st, _, err := openPostgres(ctx, url, modeMigrate, opts)
	return st, err
}

func openPostgres(ctx context.Context, url string, mode openMode, opts []Option) (Store, int, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgconn's parse errors redact the password.
		return nil, 0, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	o := buildOptions(opts)
	if o.readOnly {
		if mode == modeMigrate {
			return nil, 0, errReadOnlyMigrate
		}
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("store: open postgres: %w", err)
	}
	s := &pgStore{pool: pool, opts: o}
	var from int
	switch mode {
	case modeCurrent:
		err = s.checkCurrent(ctx)
	case modeMigrate:
		from, err = s.migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, 0, err
	}
	return s, from, nil
}

// checkCurrent refuses a database not at exactly the wanted version,
// without writing to it (not even schema_migrations).
func (s *pgStore) checkCurrent(ctx context.Context) error {
	ms, err := loadMigrations("postgres")
	if err != nil {
		return err
	}
	var exists bool
	// to_regclass follows search_path, as the store's own queries do.
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("store: open postgres: read version: %w", err)
	}
	found := 0
	if exists {
		if found, err = s.SchemaVersion(ctx); err != nil {
			return err
		}
	}
	return checkCurrent("postgres", found, len(ms))
}

func (s *pgStore) Backend() string { return "postgres" }

func (s *pgStore) Close() error {
	s.pool.Close()
	return nil
}

func (s *pgStore) now() time.Time { return normTime(s.opts.now()) }

// migrate applies pending migrations and returns the version it found.
func (s *pgStore) migrate(ctx context.Context) (from int, err error) {
	ms, err := migrationsUpTo("postgres", s.opts.migrateUpTo)
	if err != nil {
		return 0, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: migrate postgres: connect: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, pgMigrateLockKey); err != nil {
		conn.Release()
		return 0, fmt.Errorf("store: migrate postgres: lock: %w", err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pgUnlockTimeout)
		defer cancel()
		if _, uerr := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, pgMigrateLockKey); uerr != nil {
			// Closing the session releases its advisory locks.
			_ = conn.Hijack().Close(uctx)
			if err == nil {
				err = fmt.Errorf("store: migrate postgres: unlock: %w", uerr)
			}
			return
		}
		conn.Release()
	}()

	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: migrate postgres: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	current, err := applyMigrations(ctx, pgMigrationTx{tx}, migrationDialect{
		backend:       "postgres",
		appliedAtType: "TIMESTAMPTZ",
		record:        `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
		appliedAt:     func() any { return s.now() },
	}, ms)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("store: migrate postgres: commit: %w", err)
	}
	return current, nil
}

// pgMigrationTx is a pgx transaction as applyMigrations uses it. Exec
// without arguments takes the simple protocol, which runs several
// statements (a migration's file).
type pgMigrationTx struct{ tx pgx.Tx }

func (t pgMigrationTx) exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.Exec(ctx, sql, args...)
	return err
}

func (t pgMigrationTx) queryInt(ctx context.Context, sql string) (n int, err error) {
	err = t.tx.QueryRow(ctx, sql).Scan(&n)
	return n, err
}

func (s *pgStore) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("store: schema version: %w", err)
	}
	return v, nil
}

func (s *pgStore) BootstrapTenant(ctx context.Context) (string, error) {
	var id string
	if err := s.pool.QueryRow(ctx, `SELECT id FROM tenants WHERE bootstrap`).Scan(&id); err != nil {
		return "", fmt.Errorf("store: bootstrap tenant: %w", err)
	}
	return id, nil
}

func (s *pgStore) LookupTokenHash(ctx context.Context, hash [sha256.Size]byte) (verifier.MintedToken, error) {
	var (
		m       verifier.MintedToken
		kind    int16
		revoked bool
		expires *time.Time
	)
	err := s.pool.QueryRow(ctx,
		`SELECT id, subject_kind, subject_id, tenant_id, revoked_at IS NOT NULL, expires_at FROM tokens WHERE hash = $1`, hash[:]).
		Scan(&m.TokenID, &kind, &m.ID, &m.Tenant, &revoked, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return verifier.MintedToken{}, fmt.Errorf("store: %w", verifier.ErrTokenNotFound)
	case err != nil:
		return verifier.MintedToken{}, fmt.Errorf("store: lookup token: %w", err)
	}
	m.Kind = verifier.SubjectKind(kind)
	m.Revoked = revoked
	if expires != nil {
		m.ExpiresAt = expires.UTC()
	}
	return m, nil
}

func (s *pgStore) Mint(ctx context.Context, kind verifier.SubjectKind, id string, opts ...MintOption) (string, TokenInfo, error) {
	return mint(ctx, s, kind, id, opts)
}

func isPgUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == pgUniqueViolation
}

func (s *pgStore) StoreTokenHash(ctx context.Context, token string, kind verifier.SubjectKind, id string, opts ...MintOption) (TokenInfo, error) {
	mo, err := checkStoredToken(token, kind, id, opts)
	if err != nil {
		return TokenInfo{}, err
	}
	pub, err := newPublicID()
	if err != nil {
		return TokenInfo{}, err
	}
	hash := verifier.HashToken(token)
	created := s.now()
	expires := mo.expiresAt(created)
	var expiresCol *time.Time // NULL: never expires
	if !expires.IsZero() {
		expiresCol = &expires
	}
	var tenant string
	err = s.pool.QueryRow(ctx, `INSERT INTO tokens (id, hash, subject_kind, subject_id, tenant_id, created_at, expires_at)
		SELECT $1, $2, $3, $4, id, $5, $6 FROM tenants WHERE bootstrap
		RETURNING tenant_id`, pub, hash[:], int16(kind), id, created, expiresCol).Scan(&tenant)
	switch {
	case isPgUnique(err):
		return TokenInfo{}, fmt.Errorf("%w: a token with that hash is already stored", ErrConflict)
	case errors.Is(err, pgx.ErrNoRows):
		return TokenInfo{}, errors.New("store: store token: no bootstrap tenant")
	case err != nil:
		return TokenInfo{}, fmt.Errorf("store: store token: %w", err)
	}
	return TokenInfo{ID: pub, Kind: kind, SubjectID: id, Tenant: tenant, CreatedAt: created, ExpiresAt: expires}, nil
}

const pgTokenColumns = `id, subject_kind, subject_id, tenant_id, created_at, revoked_at, expires_at`

func scanPgToken(r pgx.Row) (TokenInfo, error) {
	var (
		t                TokenInfo
		kind             int16
		revoked, expires *time.Time
	)
	if err := r.Scan(&t.ID, &kind, &t.SubjectID, &t.Tenant, &t.CreatedAt, &revoked, &expires); err != nil {
		return TokenInfo{}, err
	}
	t.Kind = verifier.SubjectKind(kind)
	t.CreatedAt = t.CreatedAt.UTC()
	if revoked != nil {
		t.RevokedAt = revoked.UTC()
	}
	if expires != nil {
		t.ExpiresAt = expires.UTC()
	}
	return t, nil
}

func (s *pgStore) Revoke(ctx context.Context, tokenID string) (TokenInfo, error) {
	// COALESCE keeps the first revocation time.
	t, err := scanPgToken(s.pool.QueryRow(ctx,
		`UPDATE tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2 RETURNING `+pgTokenColumns,
		s.now(), tokenID))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return TokenInfo{}, fmt.Errorf("%w: no token with ID %q", ErrNotFound, tokenID)
	case err != nil:
		return TokenInfo{}, fmt.Errorf("store: revoke token: %w", err)
	}
	return t, nil
}

func (s *pgStore) ListTokens(ctx context.Context) ([]TokenInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pgTokenColumns+` FROM tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TokenInfo, error) { return scanPgToken(r) })
	if err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	return out, nil
}

func (s *pgStore) CountRunnerTokenIDsWithSlash(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM tokens
		WHERE subject_kind = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2)
		AND strpos(subject_id, '/') > 0`, int16(verifier.SubjectRunner), s.now()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count runner token IDs with '/': %w", err)
	}
	return n, nil
}

func (s *pgStore) RecordEnrollment(ctx context.Context, e Enrollment) (EnrollResult, error) {
	if err := checkEnrollment(&e, s.opts.now); err != nil {
		return EnrollResult{}, err
	}
	var out EnrollResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// A concurrent first enrollment of the same ID waits on the insert
		// and then finds the row, so exactly one caller sees FirstEnrollment.
		tag, err := tx.Exec(ctx, `INSERT INTO runners
			(id, tenant_id, method, cluster, node_name, node_uid, pod_name, pod_uid, version, hostname, first_enrolled_at, last_enrolled_at)
			SELECT $1, id, $2, $3, $4, $5, $6, $7, $9, $10, $8, $8 FROM tenants WHERE bootstrap
			ON CONFLICT (id) DO NOTHING`,
			e.RunnerID, e.Method, e.Cluster, e.NodeName, e.NodeUID, e.PodName, e.PodUID, e.At, e.Version, e.Hostname)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			out.FirstEnrollment = true
			return nil
		}
		var prev string
		if err := tx.QueryRow(ctx, `SELECT node_uid FROM runners WHERE id = $1 FOR UPDATE`, e.RunnerID).Scan(&prev); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE runners SET method = $2, cluster = $3, node_name = $4, node_uid = $5,
			pod_name = $6, pod_uid = $7, last_enrolled_at = $8, version = $9, hostname = $10 WHERE id = $1`,
			e.RunnerID, e.Method, e.Cluster, e.NodeName, e.NodeUID, e.PodName, e.PodUID, e.At, e.Version, e.Hostname); err != nil {
			return err
		}
		out.PreviousNodeUID = prev
		out.NodeUIDChanged = nodeUIDChanged(prev, e.NodeUID)
		return nil
	})
	if err != nil {
		return EnrollResult{}, fmt.Errorf("store: record enrollment: %w", err)
	}
	return out, nil
}

func (s *pgStore) TouchRunner(ctx context.Context, runnerID string, at time.Time) error {
	if at.IsZero() {
		at = s.opts.now()
	}
	at = normTime(at)
	// GREATEST only ever advances last_seen_at; the row count tells a missing Runner.
	tag, err := s.pool.Exec(ctx, `UPDATE runners SET last_seen_at = GREATEST(COALESCE(last_seen_at, $2), $2) WHERE id = $1`,
		runnerID, at)
	if err != nil {
		return fmt.Errorf("store: touch runner: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: no runner %q", ErrNotFound, runnerID)
	}
	return nil
}

const pgRunnerColumns = `id, tenant_id, method, cluster, node_name, node_uid, pod_name, pod_uid,
	version, hostname, first_enrolled_at, last_enrolled_at, last_seen_at`

func scanPgRunner(r pgx.Row) (Runner, error) {
	var (
		rn   Runner
		seen *time.Time
	)
	if err := r.Scan(&rn.ID, &rn.Tenant, &rn.Method, &rn.Cluster, &rn.NodeName, &rn.NodeUID, &rn.PodName, &rn.PodUID,
		&rn.Version, &rn.Hostname, &rn.FirstEnrolledAt, &rn.LastEnrolledAt, &seen); err != nil {
		return Runner{}, err
	}
	rn.FirstEnrolledAt = rn.FirstEnrolledAt.UTC()
	rn.LastEnrolledAt = rn.LastEnrolledAt.UTC()
	if seen != nil {
		rn.LastSeenAt = seen.UTC()
	}
	return rn, nil
}

func (s *pgStore) GetRunner(ctx context.Context, runnerID string) (Runner, error) {
	rn, err := scanPgRunner(s.pool.QueryRow(ctx, `SELECT `+pgRunnerColumns+` FROM runners WHERE id = $1`, runnerID))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Runner{}, fmt.Errorf("%w: no runner %q", ErrNotFound, runnerID)
	case err != nil:
		return Runner{}, fmt.Errorf("store: get runner: %w", err)
	}
	return rn, nil
}

func (s *pgStore) ListRunners(ctx context.Context) ([]Runner, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pgRunnerColumns+` FROM runners ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("store: list runners: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Runner, error) { return scanPgRunner(r) })
	if err != nil {
		return nil, fmt.Errorf("store: list runners: %w", err)
	}
	return out, nil
}
