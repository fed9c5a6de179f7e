package store

// The PostgreSQL store's quarantine (quarantine.go): displacements counted,
// quarantined Runner IDs read and cleared.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

const pgQuarantineColumns = `runner_id, window_start, displacements, last_displaced_at, newer_client, older_client, quarantined_at`

func scanPgQuarantine(r pgx.Row) (Quarantine, error) {
	var (
		q           Quarantine
		quarantined *time.Time
	)
	if err := r.Scan(&q.RunnerID, &q.WindowStart, &q.Displacements, &q.LastAt, &q.NewerClient, &q.OlderClient, &quarantined); err != nil {
		return Quarantine{}, err
	}
	q.WindowStart, q.LastAt = q.WindowStart.UTC(), q.LastAt.UTC()
	if quarantined != nil {
		q.QuarantinedAt = quarantined.UTC()
	}
	return q, nil
}

// recordDisplacement locks the ID's row for the read and the write: a
// placeholder row (no displacement yet) is inserted first if there is none,
// so two replicas counting the same ID at once queue on its lock. The
// callout's role needs INSERT and UPDATE (FOR UPDATE) on the table.
func (s *pgStore) recordDisplacement(ctx context.Context, d Displacement, p QuarantinePolicy) (Quarantine, bool, error) {
	if err := checkDisplacement(&d, p, s.opts.now); err != nil {
		return Quarantine{}, false, err
	}
	var (
		next             Quarantine
		started, changed bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO runner_quarantine (runner_id, window_start, displacements, last_displaced_at)
			VALUES ($1, $2, 0, $2) ON CONFLICT (runner_id) DO NOTHING`, d.RunnerID, d.At); err != nil {
			return err
		}
		prev, err := scanPgQuarantine(tx.QueryRow(ctx,
			`SELECT `+pgQuarantineColumns+` FROM runner_quarantine WHERE runner_id = $1 FOR UPDATE`, d.RunnerID))
		if err != nil {
			return err
		}
		next, started, changed = nextQuarantine(prev, true, d, p)
		if !changed {
			return nil
		}
		var quarantined *time.Time
		if next.Quarantined() {
			quarantined = &next.QuarantinedAt
		}
		_, err = tx.Exec(ctx, `UPDATE runner_quarantine SET window_start = $2, displacements = $3, last_displaced_at = $4,
			newer_client = $5, older_client = $6, quarantined_at = $7 WHERE runner_id = $1`,
			next.RunnerID, next.WindowStart, next.Displacements, next.LastAt, next.NewerClient, next.OlderClient, quarantined)
		return err
	})
	if err != nil {
		return Quarantine{}, false, fmt.Errorf("store: record displacement: %w", err)
	}
	return next, started, nil
}

func (s *pgStore) GetQuarantine(ctx context.Context, runnerID string) (Quarantine, error) {
	q, err := scanPgQuarantine(s.pool.QueryRow(ctx,
		`SELECT `+pgQuarantineColumns+` FROM runner_quarantine WHERE runner_id = $1 AND displacements > 0`, runnerID))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Quarantine{}, fmt.Errorf("%w: no displacement recorded for runner %q", ErrNotFound, runnerID)
	case err != nil:
		return Quarantine{}, fmt.Errorf("store: get quarantine: %w", err)
	}
	return q, nil
}

func (s *pgStore) ListQuarantined(ctx context.Context) ([]Quarantine, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pgQuarantineColumns+` FROM runner_quarantine
		WHERE quarantined_at IS NOT NULL ORDER BY runner_id`)
	if err != nil {
		return nil, fmt.Errorf("store: list quarantined: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Quarantine, error) { return scanPgQuarantine(r) })
	if err != nil {
		return nil, fmt.Errorf("store: list quarantined: %w", err)
	}
	return out, nil
}

func (s *pgStore) ClearQuarantine(ctx context.Context, runnerID string) (Quarantine, error) {
	q, err := scanPgQuarantine(s.pool.QueryRow(ctx, `DELETE FROM runner_quarantine
		WHERE runner_id = $1 AND quarantined_at IS NOT NULL RETURNING `+pgQuarantineColumns, runnerID))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Quarantine{}, fmt.Errorf("%w: runner %q is not quarantined", ErrNotFound, runnerID)
	case err != nil:
		return Quarantine{}, fmt.Errorf("store: clear quarantine: %w", err)
	}
	return q, nil
}
