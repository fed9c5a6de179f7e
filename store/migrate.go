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
