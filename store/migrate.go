package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// The migrations of each backend: files NNNN_name.sql, numbered from 1 without
// gaps, the same numbers and the same schema in both directories. A migration
// is applied once, in its own transaction, and recorded in schema_migrations.
//
//go:embed migrations
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations reads and checks one backend's embedded migrations.
func loadMigrations(backend string) ([]migration, error) {
	return readMigrations(migrationFS, backend)
}

func readMigrations(fsys fs.FS, backend string) ([]migration, error) {
	dir := path.Join("migrations", backend)
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("store: read %s migrations: %w", backend, err)
	}
	var ms []migration
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".sql")
		if !ok || e.IsDir() {
			continue
		}
		num, _, _ := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("store: %s migration %q: name must start with a positive number", backend, e.Name())
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("store: read %s migration %q: %w", backend, e.Name(), err)
		}
		ms = append(ms, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("store: %s migrations must be numbered 1, 2, ... without gaps or repeats; found %d at position %d", backend, m.version, i+1)
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("store: no %s migrations", backend)
	}
	return ms, nil
}

// migrationsUpTo is a backend's migrations up to version upTo (all of them
// when upTo is 0 or past the last): what migrate brings a database to.
func migrationsUpTo(backend string, upTo int) ([]migration, error) {
	ms, err := loadMigrations(backend)
	if err != nil {
		return nil, err
	}
	if upTo > 0 && upTo < len(ms) {
		ms = ms[:upTo]
	}
	return ms, nil
}

// migrationTx is a backend's open migration transaction, as applyMigrations
// uses it (pgMigrationTx over pgx, sqliteMigrationTx over database/sql).
type migrationTx interface {
	// exec runs sql; without args it may hold several statements.
	exec(ctx context.Context, sql string, args ...any) error
	// queryInt returns the one integer sql selects.
	queryInt(ctx context.Context, sql string) (int, error)
}

// migrationDialect is what the backends' schema_migrations differ in.
type migrationDialect struct {
	backend       string     // "postgres" or "sqlite", as errors name it
	appliedAtType string     // the column type of applied_at
	record        string     // the INSERT of one (version, name, applied_at) row, in the backend's placeholders
	appliedAt     func() any // applied_at for a migration applied now, as the backend stores times
}

// applyMigrations brings the database behind tx to version len(ms): it
// creates schema_migrations if it is missing, reads the version applied,
// refuses a database newer than ms (SchemaError), and applies and records
// each pending migration in order. It returns the version it found; the
// caller commits tx, or rolls it back on an error.
func applyMigrations(ctx context.Context, tx migrationTx, d migrationDialect, ms []migration) (int, error) {
	if err := tx.exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at `+d.appliedAtType+` NOT NULL)`); err != nil {
		return 0, fmt.Errorf("store: migrate %s: create schema_migrations: %w", d.backend, err)
	}
	current, err := tx.queryInt(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`)
	if err != nil {
		return 0, fmt.Errorf("store: migrate %s: read version: %w", d.backend, err)
	}
	if current > len(ms) {
		return 0, &SchemaError{Backend: d.backend, Found: current, Wanted: len(ms)}
	}
	for _, m := range ms[current:] {
		if err := tx.exec(ctx, m.sql); err != nil {
			return 0, fmt.Errorf("store: migrate %s: apply %04d_%s: %w", d.backend, m.version, m.name, err)
		}
		if err := tx.exec(ctx, d.record, m.version, m.name, d.appliedAt()); err != nil {
			return 0, fmt.Errorf("store: migrate %s: record %04d_%s: %w", d.backend, m.version, m.name, err)
		}
	}
	return current, nil
}

// SchemaVersionWanted is the schema version this binary wants: its highest
// migration, the same on both backends (TestMigrationsMatchAcrossBackends).
func SchemaVersionWanted() int {
	ms, err := loadMigrations("sqlite")
	if err != nil {
		// The migrations are embedded and checked by the tests; a binary
		// whose own set is broken cannot run at all.
		panic(err)
	}
	return len(ms)
}

// SchemaError says that a database is not at the schema version this binary
// wants, and what to do. It wraps ErrSchemaBehind or ErrSchemaTooNew.
type SchemaError struct {
	Backend string // "sqlite" or "postgres"
	Found   int    // the database's highest applied migration (0: none)
	Wanted  int    // SchemaVersionWanted
}

func (e *SchemaError) Error() string {
	switch {
	case e.Found > e.Wanted:
		return fmt.Sprintf("store: the %s database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary",
			e.Backend, e.Found, e.Wanted)
	case e.Found == 0:
		return fmt.Sprintf("store: the %s database has no schema yet (version 0) and this binary wants %d: run compass-server migrate",
			e.Backend, e.Wanted)
	default:
		return fmt.Sprintf("store: the %s database is at schema version %d and this binary wants %d: run compass-server migrate",
			e.Backend, e.Found, e.Wanted)
	}
}

func (e *SchemaError) Unwrap() error {
	if e.Found > e.Wanted {
		return ErrSchemaTooNew
	}
	return ErrSchemaBehind
}

// checkCurrent is OpenCurrent's rule: exactly the wanted version.
func checkCurrent(backend string, found, wanted int) error {
	if found != wanted {
		return &SchemaError{Backend: backend, Found: found, Wanted: wanted}
	}
	return nil
}

// MigrateResult says what Migrate did.
type MigrateResult struct {
	Backend string // "sqlite" or "postgres"
	From    int    // the schema version before (0: a new database)
	To      int    // the schema version after: SchemaVersionWanted
}
