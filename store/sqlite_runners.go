package store

// The SQLite store's Runner registry: enrollments, last_seen, reads.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

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
