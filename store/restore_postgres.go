package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL side of restorable. A PostgreSQL backup is a pg_dump,
// restored with pg_restore into a new database; Reconcile then re-applies
// the old database's later revocations and stamps the new database's OID.

func (s *pgStore) migrateNow(ctx context.Context) (int, error) { return s.migrate(ctx) }

// guard compares the OID the schema was stamped with to the database's own:
// pg_dump carries the row, so a restored dump names the database it came
// from.
func (s *pgStore) guard(ctx context.Context) (guardState, error) {
	var (
		taken   *time.Time
		stamped *int64
		current int64
	)
	err := s.pool.QueryRow(ctx, `SELECT g.backup_taken_at, g.database_oid,
		(SELECT oid::bigint FROM pg_database WHERE datname = current_database())
		FROM restore_guard g WHERE g.id = 1`).Scan(&taken, &stamped, &current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return guardState{missing: true}, nil
	case err != nil:
		return guardState{}, fmt.Errorf("store: read the restore guard: %w", err)
	}
	g := guardState{oidMismatch: stamped == nil || *stamped != current}
	if taken != nil {
		g.backupTakenAt = taken.UTC()
	}
	return g, nil
}

func (s *pgStore) tokenStates(ctx context.Context) ([]tokenState, error) {
	var hasExpiry bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'tokens' AND column_name = 'expires_at')`).Scan(&hasExpiry); err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	expires := "NULL::timestamptz"
	if hasExpiry {
		expires = "expires_at"
	}
	rows, err := s.pool.Query(ctx, `SELECT hash, id, subject_kind, subject_id, tenant_id, created_at, revoked_at, `+expires+` FROM tokens`)
	if err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tokenState, error) {
		var (
			ts   tokenState
			hash []byte
		)
		info, err := scanPgToken(pgPrefixRow{r, &hash})
		if err != nil {
			return ts, err
		}
		if len(hash) != len(ts.Hash) {
			return ts, fmt.Errorf("token %s has a %d-byte hash", info.ID, len(hash))
		}
		copy(ts.Hash[:], hash)
		ts.Info = info
		return ts, nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	return out, nil
}

// pgPrefixRow scans one leading column into first, then the rest as the
// row scanner written for the columns after it expects.
type pgPrefixRow struct {
	r     pgx.Row
	first any
}

func (p pgPrefixRow) Scan(dest ...any) error { return p.r.Scan(append([]any{p.first}, dest...)...) }

func (s *pgStore) runnerIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM runners`)
	if err != nil {
		return nil, fmt.Errorf("store: read runners: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: read runners: %w", err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

func (s *pgStore) reconcile(ctx context.Context, revs []tokenState, at time.Time) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, r := range revs {
			if _, err := tx.Exec(ctx, `UPDATE tokens SET revoked_at = $1 WHERE hash = $2 AND revoked_at IS NULL`,
				r.Info.RevokedAt, r.Hash[:]); err != nil {
				return fmt.Errorf("revoke token %s again: %w", r.Info.ID, err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO restore_guard (id, backup_taken_at, database_oid, restored_at)
			SELECT 1, NULL, oid::bigint, $1 FROM pg_database WHERE datname = current_database()
			ON CONFLICT (id) DO UPDATE SET backup_taken_at = NULL, database_oid = excluded.database_oid, restored_at = excluded.restored_at`, at); err != nil {
			return fmt.Errorf("stamp the restore guard: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	return nil
}

// identity is the database's OID, schema and server address: two URLs with
// the same identity name one database (the same schema of it).
func (s *pgStore) identity(ctx context.Context) (string, error) {
	var id string
	err := s.pool.QueryRow(ctx, `SELECT (SELECT oid::text FROM pg_database WHERE datname = current_database())
		|| '/' || COALESCE(current_schema(), '') || '@' || COALESCE(host(inet_server_addr()), 'local') || ':' || COALESCE(inet_server_port()::text, '')`).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("store: restore: %w", err)
	}
	return "postgres:" + id, nil
}
