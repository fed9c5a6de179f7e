package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
)

// migrateUpTo makes the database at url as the release whose last
// migration was n left it.
func migrateUpTo(t *testing.T, url string, n int) {
	t.Helper()
	if n == 0 {
		// Empty: a PostgreSQL schema is; an SQLite file is made so.
		if path, ok := strings.CutPrefix(url, "sqlite://"); ok {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	st, err := store.Open(t.Context(), url, store.WithMigrationsUpTo(n))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSQLiteCheckSchema(t *testing.T) { storetest.CheckSchema(t, sqliteBackend(), migrateUpTo) }

func TestPostgresCheckSchema(t *testing.T) {
	storetest.CheckSchema(t, postgresBackend(postgresURL(t)), migrateUpTo)
}

// A data dir without a database is refused, and stays without one: the
// check creates neither the file nor its directory.
func TestCheckSchemaCreatesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	_, err := store.CheckSchema(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if !errors.Is(err, store.ErrNoDatabase) {
		t.Fatalf("CheckSchema without a database = %v, want ErrNoDatabase", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CheckSchema made the data dir: %v", err)
	}
}
