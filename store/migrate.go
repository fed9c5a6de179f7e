package store

import (
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
