package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// slogText logs text lines to w, at Info and above.
func slogText(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// migrated returns a data dir whose SQLite database compass-server migrate
// has created.
func migrated(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if code, _, stderr := run(t, nil, "migrate", "--data-dir", dir); code != 0 {
		t.Fatalf("migrate: code %d, stderr %q", code, stderr)
	}
	return dir
}

// listDir names what is in dir, for "nothing was created" checks.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// migrate says from which schema version to which, creates the SQLite
// database when there is none, and has nothing to do when run again.
func TestMigrateCommand(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "compass.db")
	wanted := store.SchemaVersionWanted()
	code, stdout, stderr := run(t, nil, "migrate", "--data-dir", filepath.Join(dir, "data"))
	if want := fmt.Sprintf("migrated the SQLite database %s from schema version 0 to %d\n", db, wanted); code != 0 || stdout != want || stderr != "" {
		t.Fatalf("migrate: code %d, stdout %q (want %q), stderr %q", code, stdout, want, stderr)
	}
	code, stdout, _ = run(t, nil, "migrate", "--database-url", "sqlite://"+db)
	if want := fmt.Sprintf("the SQLite database %s is at schema version %d: nothing to migrate\n", db, wanted); code != 0 || stdout != want {
		t.Fatalf("migrate again: code %d, stdout %q, want %q", code, stdout, want)
	}
	var rows int
	if err := storetest.RawSQLite(t, "sqlite://"+db).QueryRowContext(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&rows); err != nil || rows != wanted {
		t.Fatalf("schema_migrations: %d rows (%v), want %d", rows, err, wanted)
	}
	// An unknown scheme is a failure with the reason.
	code, _, stderr = run(t, nil, "migrate", "--database-url", "mysql://u@h/db")
	if code != 1 || stderr != "compass-server: server: migrate: store: invalid database URL: unknown scheme \"mysql\" (want postgres://, postgresql:// or sqlite://)\n" {
		t.Fatalf("migrate mysql://: code %d, stderr %q", code, stderr)
	}
}

// The operator commands never create a database: in an empty directory
// each fails with what to run, and the directory stays empty (no .data,
// no compass.db).
func TestOperatorCommandsCreateNothing(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	want := "compass-server: server: store: no database at .data/compass.db: run compass-server migrate to create it\n"
	for _, args := range [][]string{
		{"list-tokens"},
		{"runners"},
		{"mint-runner-token", "--runner-id", "build-01"},
		{"mint-account-token", "--name", "ops"},
		{"revoke-token", "0123456789abcdef"},
		{"backup", "--to", "backup.db"},
	} {
		code, stdout, stderr := run(t, nil, args...)
		if code != 1 || stdout != "" || stderr != want {
			t.Fatalf("%q in an empty dir: code %d, stdout %q, stderr %q; want %q", args, code, stdout, stderr, want)
		}
		if names := listDir(t, dir); len(names) != 0 {
			t.Fatalf("%q created %v", args, names)
		}
	}
}

// setSchema rewrites the SQLite database in dir as a release at version v
// would have it: the columns of later migrations dropped and their records
// removed (v below this binary's), or a newer migration recorded (above).
func setSchema(t *testing.T, dir string, v int) {
	t.Helper()
	db := storetest.RawSQLite(t, "sqlite://"+filepath.Join(dir, "compass.db"))
	wanted := store.SchemaVersionWanted()
	var stmts []string
	switch {
	case v == wanted-1 && wanted == 3:
		stmts = []string{`ALTER TABLE tokens DROP COLUMN expires_at`, `DELETE FROM schema_migrations WHERE version = 3`}
	case v > wanted:
		for n := wanted + 1; n <= v; n++ {
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, '%04d_newer', '2030-01-01T00:00:00.000000Z')`, n, n))
		}
	default:
		t.Fatalf("setSchema(%d) with this binary at %d: teach it how", v, wanted)
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// schemaRows counts schema_migrations, to see that nothing migrated.
func schemaRows(t *testing.T, dir string) int {
	t.Helper()
	var n int
	if err := storetest.RawSQLite(t, "sqlite://"+filepath.Join(dir, "compass.db")).QueryRowContext(t.Context(),
		"SELECT count(*) FROM schema_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every command but migrate refuses a schema behind or ahead of it with
// the versions and what to run, and changes nothing; serve migrates an
// SQLite database behind it and refuses one ahead of it.
func TestCommandsRefuseSchemaBehindOrAhead(t *testing.T) {
	wanted := store.SchemaVersionWanted()
	commands := func(dir string) [][]string {
		return [][]string{
			{"list-tokens", "--data-dir", dir},
			{"runners", "--data-dir", dir},
			{"mint-runner-token", "--runner-id", "build-01", "--data-dir", dir},
			{"mint-account-token", "--name", "ops", "--data-dir", dir},
			{"revoke-token", "0123456789abcdef", "--data-dir", dir},
		}
	}

	behind := migrated(t)
	setSchema(t, behind, wanted-1)
	want := fmt.Sprintf("compass-server: server: store: the sqlite database is at schema version %d and this binary wants %d: run compass-server migrate\n", wanted-1, wanted)
	for _, args := range commands(behind) {
		if code, stdout, stderr := run(t, nil, args...); code != 1 || stdout != "" || stderr != want {
			t.Fatalf("%q on schema %d: code %d, stdout %q, stderr %q; want %q", args, wanted-1, code, stdout, stderr, want)
		}
	}
	if n := schemaRows(t, behind); n != wanted-1 {
		t.Fatalf("a refused command migrated: %d schema_migrations rows, want %d", n, wanted-1)
	}

	ahead := migrated(t)
	setSchema(t, ahead, wanted+1)
	want = fmt.Sprintf("compass-server: server: store: the sqlite database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary\n", wanted+1, wanted)
	for _, args := range append(commands(ahead), []string{"migrate", "--data-dir", ahead}) {
		if args[0] == "migrate" {
			want = strings.Replace(want, "server: store:", "server: migrate: store:", 1)
		}
		if code, stdout, stderr := run(t, nil, args...); code != 1 || stdout != "" || stderr != want {
			t.Fatalf("%q on schema %d: code %d, stdout %q, stderr %q; want %q", args, wanted+1, code, stdout, stderr, want)
		}
	}

	// serve: ahead refused, with the same reason.
	certFile, keyFile, _ := devTLS(t, t.TempDir())
	code, _, stderr := run(t, nil, "serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--data-dir", ahead)
	wantServe := fmt.Sprintf("compass-server: server: store: the sqlite database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary\n", wanted+1, wanted)
	if code != 1 || !strings.HasSuffix(stderr, wantServe) {
		t.Fatalf("serve on a newer schema: code %d, stderr %q; want it to end %q", code, stderr, wantServe)
	}
	// serve: an SQLite database behind it is migrated on start, and says so.
	var logs lockedWriter
	si, done, cancel := serveUntilReady(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: behind,
		Logger: slogText(&logs)})
	if si.DoorAddr == "" {
		t.Fatalf("serve on an SQLite schema behind it: %v", <-done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := schemaRows(t, behind); n != wanted {
		t.Fatalf("serve did not migrate SQLite: %d schema_migrations rows, want %d", n, wanted)
	}
	wantLog := fmt.Sprintf(`msg="server: migrated the database" database="the SQLite database %s" from=%d to=%d`, filepath.Join(behind, "compass.db"), wanted-1, wanted)
	if !strings.Contains(logs.String(), wantLog) {
		t.Fatalf("serve's log does not say %s:\n%s", wantLog, logs.String())
	}
	if code, _, stderr := run(t, nil, "list-tokens", "--data-dir", behind); code != 0 {
		t.Fatalf("list-tokens after serve migrated: %s", stderr)
	}
}

// postgresTestURL is the test server's URL, or a skip on a laptop and a
// failure in CI (as the store's PostgreSQL tests do).
func postgresTestURL(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("COMPASS_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	msg := `COMPASS_TEST_POSTGRES_URL is not set: start a server with eval "$(bash .ci/postgres.sh)" and run the tests again`
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// postgresSchema makes a schema of its own on the test server, dropped when
// t ends, and returns a URL that uses it.
func postgresSchema(t *testing.T) string {
	t.Helper()
	admin := postgresTestURL(t)
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	schema := "servertest_" + hex.EncodeToString(b[:])
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
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// On PostgreSQL serve never migrates: on a schema behind it, it refuses to
// start until compass-server migrate has run; the operator commands refuse
// too, then work.
func TestServeOnPostgresRefusesUntilMigrated(t *testing.T) {
	pg := postgresSchema(t)
	wanted := store.SchemaVersionWanted()
	certFile, keyFile, _ := devTLS(t, t.TempDir())
	serveArgs := []string{"serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--database-url", pg}
	want := fmt.Sprintf("compass-server: server: store: the postgres database has no schema yet (version 0) and this binary wants %d: run compass-server migrate\n", wanted)
	if code, _, stderr := run(t, nil, serveArgs...); code != 1 || !strings.HasSuffix(stderr, want) {
		t.Fatalf("serve on an empty PostgreSQL database: code %d, stderr %q; want it to end %q", code, stderr, want)
	}
	if code, _, stderr := run(t, nil, "list-tokens", "--database-url", pg); code != 1 || stderr != want {
		t.Fatalf("list-tokens on an empty PostgreSQL database: code %d, stderr %q", code, stderr)
	}
	u, _ := url.Parse(pg)
	code, stdout, stderr := run(t, nil, "migrate", "--database-url", pg)
	wantOut := fmt.Sprintf("migrated the PostgreSQL database %s on %s from schema version 0 to %d\n", strings.TrimPrefix(u.Path, "/"), u.Host, wanted)
	if code != 0 || stdout != wantOut {
		t.Fatalf("migrate: code %d, stdout %q (want %q), stderr %q", code, stdout, wantOut, stderr)
	}
	if code, _, stderr := run(t, nil, "mint-runner-token", "--runner-id", "build-01", "--database-url", pg); code != 0 {
		t.Fatalf("mint after migrate: %s", stderr)
	}
	si, done, cancel := serveUntilReady(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DatabaseURL: pg})
	if si.DoorAddr == "" {
		t.Fatalf("serve after migrate: %v", <-done)
	}
	if si.Store.Backend() != "postgres" {
		t.Fatalf("serve's store is %s", si.Store.Backend())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// backup copies the SQLite database while it is in use; the copy holds the
// same tokens, opens with the operator commands, and an existing file is
// never overwritten.
func TestBackupCommand(t *testing.T) {
	dir := migrated(t)
	code, stdout, _ := run(t, nil, "mint-runner-token", "--runner-id", "build-01", "--data-dir", dir)
	if code != 0 {
		t.Fatal("mint failed")
	}
	tok := strings.TrimSpace(stdout)
	st := openStore(t, dir) // held open: the backup is taken beside a user
	to := filepath.Join(t.TempDir(), "compass-backup.db")
	code, stdout, stderr := run(t, nil, "backup", "--data-dir", dir, "--to", to)
	want := fmt.Sprintf("backed up the SQLite database %s (schema version %d) to %s\n", filepath.Join(dir, "compass.db"), store.SchemaVersionWanted(), to)
	if code != 0 || stdout != want {
		t.Fatalf("backup: code %d, stdout %q (want %q), stderr %q", code, stdout, want, stderr)
	}
	orig, err := st.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_, list, _ := run(t, nil, "list-tokens", "--database-url", "sqlite://"+to)
	if len(orig) != 1 || !strings.Contains(list, orig[0].ID) || !strings.Contains(list, "build-01") {
		t.Fatalf("list-tokens on the backup:\n%s", list)
	}
	cp, err := store.OpenCurrent(t.Context(), "sqlite://"+to)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if s, err := verifier.NewResolver(nil, cp).Resolve(t.Context(), tok, verifier.SubjectRunner); err != nil || s.ID != "build-01" {
		t.Fatalf("the token in the backup: %+v, %v", s, err)
	}
	before, err := os.ReadFile(to)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run(t, nil, "backup", "--data-dir", dir, "--to", to); code != 1 || !strings.Contains(stderr, "file exists") {
		t.Fatalf("backup over an existing file: code %d, stderr %q", code, stderr)
	}
	if after, _ := os.ReadFile(to); string(after) != string(before) {
		t.Fatal("backup overwrote an existing file")
	}
	code, _, stderr = run(t, nil, "backup", "--database-url", "postgres://u@127.0.0.1:1/db", "--to", filepath.Join(t.TempDir(), "x"))
	if code != 1 || stderr != "compass-server: server: store: backup: a PostgreSQL database is backed up with pg_dump -Fc and restored with pg_restore\n" {
		t.Fatalf("backup of PostgreSQL: code %d, stderr %q", code, stderr)
	}
}
