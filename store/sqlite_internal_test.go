package store

import (
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
