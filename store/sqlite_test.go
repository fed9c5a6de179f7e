package store_test

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-runner/identity/store/storetest"
)

func TestSQLiteConformance(t *testing.T) {
	storetest.Run(t, sqliteBackend())
}

func sqliteBackend() storetest.Backend {
	return storetest.Backend{
		Name: "sqlite",
		NewURL: func(t *testing.T) string {
			t.Helper()
			return "sqlite://" + filepath.Join(t.TempDir(), "data", "compass.db")
		},
		Exec: func(t *testing.T, url, query string) {
			t.Helper()
			db := rawSQLite(t, url)
			if _, err := db.ExecContext(t.Context(), query); err != nil {
				t.Fatalf("exec %q: %v", query, err)
			}
		},
		QueryInt: func(t *testing.T, url, query string) int64 {
			t.Helper()
			var n int64
			if err := rawSQLite(t, url).QueryRowContext(t.Context(), query).Scan(&n); err != nil {
				t.Fatalf("query %q: %v", query, err)
			}
			return n
		},
		InsertToken: func(t *testing.T, url string, r storetest.TokenRow) {
			t.Helper()
			var revoked any
			if !r.RevokedAt.IsZero() {
				revoked = sqliteTime(r.RevokedAt)
			}
			_, err := rawSQLite(t, url).ExecContext(t.Context(), `INSERT INTO tokens
				(id, hash, subject_kind, subject_id, tenant_id, created_at, revoked_at)
				SELECT ?, ?, ?, ?, id, ?, ? FROM tenants WHERE bootstrap = 1`,
				r.PublicID, r.Hash[:], int(r.Kind), r.SubjectID, sqliteTime(r.CreatedAt), revoked)
			if err != nil {
				t.Fatalf("insert token row: %v", err)
			}
		},
	}
}

func sqliteTime(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format("2006-01-02T15:04:05.000000Z")
}

// rawSQLite opens the file behind a sqlite:// URL directly, for rows the API
// refuses to write.
func rawSQLite(t *testing.T, url string) *sql.DB {
	t.Helper()
	path := url[len("sqlite://"):]
	db, err := sql.Open("sqlite", fmt.Sprintf("%s?_busy_timeout=5000&_foreign_keys=1", path))
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
