package store

// The SQLite store's quarantine (quarantine.go): displacements counted,
// quarantined Runner IDs read and cleared.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

const sqliteQuarantineColumns = `runner_id, window_start, displacements, last_displaced_at, newer_client, older_client, quarantined_at`

func scanSQLiteQuarantine(r scanner) (Quarantine, error) {
	var (
		q                      Quarantine
		start, last, quarantin sql.NullString
	)
	if err := r.Scan(&q.RunnerID, &start, &q.Displacements, &last, &q.NewerClient, &q.OlderClient, &quarantin); err != nil {
		return Quarantine{}, err
	}
	var err error
	if q.WindowStart, err = parseTime(start); err != nil {
		return Quarantine{}, err
	}
	if q.LastAt, err = parseTime(last); err != nil {
		return Quarantine{}, err
	}
	if q.QuarantinedAt, err = parseTime(quarantin); err != nil {
		return Quarantine{}, err
	}
	return q, nil
}

func (s *sqliteStore) recordDisplacement(ctx context.Context, d Displacement, p QuarantinePolicy) (Quarantine, bool, error) {
	if err := checkDisplacement(&d, p, s.opts.now); err != nil {
		return Quarantine{}, false, err
	}
	release, err := s.write(ctx)
	if err != nil {
		return Quarantine{}, false, fmt.Errorf("store: record displacement: %w", err)
	}
	defer release()
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: read and write under one write lock
	if err != nil {
		return Quarantine{}, false, fmt.Errorf("store: record displacement: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	prev, err := scanSQLiteQuarantine(tx.QueryRowContext(ctx,
		`SELECT `+sqliteQuarantineColumns+` FROM runner_quarantine WHERE runner_id = ?`, d.RunnerID))
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Quarantine{}, false, fmt.Errorf("store: record displacement: %w", err)
	}
	next, started, changed := nextQuarantine(prev, found, d, p)
	if !changed {
		return next, false, nil
	}
	var quarantined any
	if next.Quarantined() {
		quarantined = fmtTime(next.QuarantinedAt)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO runner_quarantine (`+sqliteQuarantineColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (runner_id) DO UPDATE SET window_start = excluded.window_start, displacements = excluded.displacements,
			last_displaced_at = excluded.last_displaced_at, newer_client = excluded.newer_client,
			older_client = excluded.older_client, quarantined_at = excluded.quarantined_at`,
		next.RunnerID, fmtTime(next.WindowStart), next.Displacements, fmtTime(next.LastAt), next.NewerClient, next.OlderClient, quarantined); err != nil {
		return Quarantine{}, false, fmt.Errorf("store: record displacement: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return Quarantine{}, false, fmt.Errorf("store: record displacement: %w", err)
	}
	return next, started, nil
}

func (s *sqliteStore) GetQuarantine(ctx context.Context, runnerID string) (Quarantine, error) {
	q, err := scanSQLiteQuarantine(s.db.QueryRowContext(ctx,
		`SELECT `+sqliteQuarantineColumns+` FROM runner_quarantine WHERE runner_id = ?`, runnerID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Quarantine{}, fmt.Errorf("%w: no displacement recorded for runner %q", ErrNotFound, runnerID)
	case err != nil:
		return Quarantine{}, fmt.Errorf("store: get quarantine: %w", err)
	}
	return q, nil
}

func (s *sqliteStore) ListQuarantined(ctx context.Context) ([]Quarantine, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sqliteQuarantineColumns+` FROM runner_quarantine
		WHERE quarantined_at IS NOT NULL ORDER BY runner_id`)
	if err != nil {
		return nil, fmt.Errorf("store: list quarantined: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Quarantine
	for rows.Next() {
		q, err := scanSQLiteQuarantine(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list quarantined: %w", err)
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list quarantined: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) ClearQuarantine(ctx context.Context, runnerID string) (Quarantine, error) {
	release, err := s.write(ctx)
	if err != nil {
		return Quarantine{}, fmt.Errorf("store: clear quarantine: %w", err)
	}
	defer release()
	q, err := scanSQLiteQuarantine(s.db.QueryRowContext(ctx, `DELETE FROM runner_quarantine
		WHERE runner_id = ? AND quarantined_at IS NOT NULL RETURNING `+sqliteQuarantineColumns, runnerID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Quarantine{}, fmt.Errorf("%w: runner %q is not quarantined", ErrNotFound, runnerID)
	case err != nil:
		return Quarantine{}, fmt.Errorf("store: clear quarantine: %w", err)
	}
	return q, nil
}
