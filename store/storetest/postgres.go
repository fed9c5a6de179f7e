package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresURLEnv names the PostgreSQL server the tests run against:
// eval "$(bash .ci/postgres.sh)" sets it.
const PostgresURLEnv = "COMPASS_TEST_POSTGRES_URL"

// PostgresURL returns the test server's URL. Without one a test is skipped
// on a developer's machine and fails in CI, which must never skip it
// silently.
func PostgresURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(PostgresURLEnv); u != "" {
		return u
	}
	msg := PostgresURLEnv + ` is not set: start a server with eval "$(bash .ci/postgres.sh)" and run the tests again`
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// PostgresSchema makes a schema of its own (named prefix plus random hex)
// on the test server, dropped when t ends, and returns a URL that uses it
// (search_path), so tests and packages running at once never see each
// other's rows.
func PostgresSchema(t testing.TB, prefix string) string {
	t.Helper()
	admin := PostgresURL(t)
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	schema := prefix + "_" + hex.EncodeToString(b[:])
	exec := func(ctx context.Context, q string) error {
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close(ctx) }()
		_, err = c.Exec(ctx, q)
		return err
	}
	if err := exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is cancelled before cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("parse %s: %v", PostgresURLEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
