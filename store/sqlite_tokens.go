package store

// The SQLite store's tenants and minted tokens: look up by hash, mint,
// revoke, list.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"

	"github.com/compass-runner/identity/verifier"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

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
