package store

import (
	"database/sql"
	"path/filepath"
	"testing"
)

// Every pooled connection runs with WAL, foreign keys, the busy timeout and
// full synchronous commits (a revocation must survive a power cut).
func TestSQLitePragmas(t *testing.T) {
	st, err := OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "compass.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	db := st.(*sqliteStore).db
	// Hold several connections at once so the check is not of one connection only.
	conns := make([]interface{ Close() error }, 0, 3)
	for range 3 {
		c, err := db.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		for _, p := range []struct {
			pragma string
			want   string
		}{
			{"journal_mode", "wal"},
			{"foreign_keys", "1"},
			{"busy_timeout", "5000"},
			{"synchronous", "2"}, // FULL
		} {
			var got string
			if err := c.QueryRowContext(t.Context(), "PRAGMA "+p.pragma).Scan(&got); err != nil {
				t.Fatalf("PRAGMA %s: %v", p.pragma, err)
			}
			if got != p.want {
				t.Fatalf("PRAGMA %s = %q, want %q", p.pragma, got, p.want)
			}
		}
	}
	for _, c := range conns {
		_ = c.Close()
	}
	// Foreign keys are enforced: a token for a tenant that does not exist fails.
	_, err = db.ExecContext(t.Context(), `INSERT INTO tokens (id, hash, subject_kind, subject_id, tenant_id, created_at)
		VALUES ('0000000000000001', zeroblob(32), 2, 'r1', 'no-such-tenant', '2026-01-01T00:00:00.000000Z')`)
	if err == nil {
		t.Fatal("a token row with an unknown tenant was accepted: foreign keys are off")
	}
}

// A database made by the first schema keeps its Runners when a newer binary
// opens it: 0002 adds version and hostname, empty for the rows already there.
func TestSQLiteUpgradeKeepsRunners(t *testing.T) {
	path := filepath.Join(t.TempDir(), "compass.db")
	ms, err := loadMigrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 2 || ms[1].name != "0002_runner_version_hostname" {
		t.Fatalf("migrations %d: want 0002_runner_version_hostname second", len(ms))
	}
	// The database as the first release left it: migration 1 and one Runner.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		ms[0].sql,
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`,
		`INSERT INTO schema_migrations VALUES (1, '0001_init', '2026-01-01T00:00:00.000000Z')`,
		`INSERT INTO runners (id, tenant_id, method, first_enrolled_at, last_enrolled_at)
		 VALUES ('r1', 'bootstrap', 'minted', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')`,
	} {
		if _, err := db.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	st, err := OpenSQLite(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if v, err := st.SchemaVersion(t.Context()); err != nil || v != len(ms) {
		t.Fatalf("schema version %d (%v), want %d", v, err, len(ms))
	}
	rn, err := st.GetRunner(t.Context(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	if rn.Method != MethodMinted || rn.Version != "" || rn.Hostname != "" {
		t.Fatalf("runner after upgrade: %+v", rn)
	}
}
