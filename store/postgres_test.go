package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"

	"github.com/jackc/pgx/v5"
)

// postgresURLEnv names the server the PostgreSQL suite runs against:
// eval "$(bash .ci/postgres.sh)" sets it.
const postgresURLEnv = "COMPASS_TEST_POSTGRES_URL"

// cleanupTimeout bounds dropping a test's schema and closing connections
// after the test's own context has ended.
const cleanupTimeout = 10 * time.Second

func TestPostgresConformance(t *testing.T) {
	admin := postgresURL(t)
	storetest.Run(t, postgresBackend(admin))
}

// postgresURL returns the test server's URL. Without one the suite is skipped
// on a developer's machine and fails in CI, which must never skip it silently.
func postgresURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv(postgresURLEnv)
	if u != "" {
		return u
	}
	msg := postgresURLEnv + ` is not set: start a server with eval "$(bash .ci/postgres.sh)" and run the tests again`
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func postgresBackend(admin string) storetest.Backend {
	return storetest.Backend{
		Name: "postgres",
		// Each test gets a schema of its own, dropped when it ends, so runs
		// and parallel packages never see each other's rows.
		NewURL: func(t *testing.T) string {
			t.Helper()
			var b [8]byte
			if _, err := rand.Read(b[:]); err != nil {
				t.Fatal(err)
			}
			schema := "storetest_" + hex.EncodeToString(b[:])
			conn := rawPostgres(t, admin)
			if _, err := conn.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
				t.Fatalf("create schema: %v", err)
			}
			t.Cleanup(func() {
				// t.Context is cancelled before cleanups run.
				ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
				defer cancel()
				c, err := pgx.Connect(ctx, admin)
				if err != nil {
					t.Errorf("drop schema %s: %v", schema, err)
					return
				}
				defer func() { _ = c.Close(ctx) }()
				if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
					t.Errorf("drop schema %s: %v", schema, err)
				}
			})
			u, err := url.Parse(admin)
			if err != nil {
				t.Fatalf("parse %s: %v", postgresURLEnv, err)
			}
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return u.String()
		},
		Exec: func(t *testing.T, url, query string) {
			t.Helper()
			if _, err := rawPostgres(t, url).Exec(t.Context(), query); err != nil {
				t.Fatalf("exec %q: %v", query, err)
			}
		},
		QueryInt: func(t *testing.T, url, query string) int64 {
			t.Helper()
			var n int64
			if err := rawPostgres(t, url).QueryRow(t.Context(), query).Scan(&n); err != nil {
				t.Fatalf("query %q: %v", query, err)
			}
			return n
		},
		InsertToken: func(t *testing.T, url string, r storetest.TokenRow) {
			t.Helper()
			var revoked, expires *time.Time
			if !r.RevokedAt.IsZero() {
				revoked = &r.RevokedAt
			}
			if !r.ExpiresAt.IsZero() {
				expires = &r.ExpiresAt
			}
			_, err := rawPostgres(t, url).Exec(t.Context(), `INSERT INTO tokens
				(id, hash, subject_kind, subject_id, tenant_id, created_at, revoked_at, expires_at)
				SELECT $1, $2, $3, $4, id, $5, $6, $7 FROM tenants WHERE bootstrap`,
				r.PublicID, r.Hash[:], int16(r.Kind), r.SubjectID, r.CreatedAt, revoked, expires)
			if err != nil {
				t.Fatalf("insert token row: %v", err)
			}
		},
	}
}

// rawPostgres connects to url directly, for rows the API refuses to write.
func rawPostgres(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// Both backends end up with the same tables, columns (in order) and indexes.
func TestSchemasMatch(t *testing.T) {
	pgURL := postgresBackend(postgresURL(t)).NewURL(t)
	liteURL := sqliteBackend().NewURL(t)
	for _, u := range []string{pgURL, liteURL} {
		st, err := store.Open(t.Context(), u)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
	}
	lite := rawSQLite(t, liteURL)
	pg := rawPostgres(t, pgURL)

	liteList := func(query string, args ...any) []string {
		t.Helper()
		rows, err := lite.QueryContext(t.Context(), query, args...)
		if err != nil {
			t.Fatalf("sqlite %q: %v", query, err)
		}
		defer func() { _ = rows.Close() }()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	pgList := func(query string, args ...any) []string {
		t.Helper()
		rows, err := pg.Query(t.Context(), query, args...)
		if err != nil {
			t.Fatalf("postgres %q: %v", query, err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("postgres %q: %v", query, err)
		}
		return out
	}

	liteTables := liteList(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	pgTables := pgList(`SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY table_name`)
	if !slices.Equal(liteTables, pgTables) {
		t.Fatalf("tables: sqlite %v, postgres %v", liteTables, pgTables)
	}
	for _, table := range liteTables {
		lc := liteList(`SELECT name FROM pragma_table_info(?) ORDER BY cid`, table)
		pc := pgList(`SELECT column_name::text FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, table)
		if !slices.Equal(lc, pc) {
			t.Fatalf("columns of %s: sqlite %v, postgres %v", table, lc, pc)
		}
	}
	// Named indexes (the implicit ones of primary keys and UNIQUE columns
	// are named differently by each database).
	liteIdx := liteList(`SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name`)
	pgIdx := pgList(`SELECT indexname::text FROM pg_indexes WHERE schemaname = current_schema()
		AND indexname NOT LIKE '%_pkey' AND indexname NOT LIKE '%_key' ORDER BY indexname`)
	if !slices.Equal(liteIdx, pgIdx) {
		t.Fatalf("indexes: sqlite %v, postgres %v", liteIdx, pgIdx)
	}
	if len(liteTables) < 4 || len(liteIdx) < 2 {
		t.Fatalf("compared %d tables and %d indexes; the schema has at least 4 and 2", len(liteTables), len(liteIdx))
	}
}
