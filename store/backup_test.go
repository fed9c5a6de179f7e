package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// backupState is what a backup must carry over: every token's public record
// and every Runner, and a token that must still resolve.
type backupState struct {
	tokens  []store.TokenInfo
	runners []store.Runner
	live    string // a live token's secret
}

// sqliteInDataDir opens a new SQLite store at dir/data/compass.db, as
// compass-server serve --data-dir dir does, on a clock stopped at
// 2026-05-01 12:00 UTC. It returns the store (the caller closes it), the
// database file, its URL and the clock.
func sqliteInDataDir(t *testing.T, dir string) (store.Store, string, string, *storetest.Clock) {
	t.Helper()
	path := filepath.Join(dir, "data", "compass.db")
	url := "sqlite://" + path
	clock := storetest.NewClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	st, err := store.Open(t.Context(), url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	return st, path, url, clock
}

// writeBackupState fills st with tokens (one with a TTL, one revoked) and
// Runners (one seen), and returns what it wrote.
func writeBackupState(t *testing.T, st store.Store, clock *storetest.Clock) backupState {
	t.Helper()
	ctx := t.Context()
	live, _, err := st.Mint(ctx, verifier.SubjectRunner, "build-01")
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if _, _, err := st.Mint(ctx, verifier.SubjectAccount, "ops", store.WithTTL(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	_, revoked, err := st.Mint(ctx, verifier.SubjectRunner, "old-host")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Revoke(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	for _, e := range []store.Enrollment{
		{RunnerID: "build-01", Method: store.MethodMinted, Version: "v1.2.3", Hostname: "build-01"},
		{RunnerID: "prod/node-a", Method: store.MethodProjected, Cluster: "prod", NodeName: "node-a", NodeUID: "uid-a", PodName: "p", PodUID: "pu"},
	} {
		if _, err := st.RecordEnrollment(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.TouchRunner(ctx, "build-01", clock.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	return readBackupState(t, st, live)
}

func readBackupState(t *testing.T, st store.Store, live string) backupState {
	t.Helper()
	toks, err := st.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rs, err := st.ListRunners(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return backupState{tokens: toks, runners: rs, live: live}
}

// assertRestored checks that the store opened on a restored copy holds want.
func assertRestored(t *testing.T, st store.Store, want backupState) {
	t.Helper()
	got := readBackupState(t, st, want.live)
	if !slices.Equal(got.tokens, want.tokens) {
		t.Fatalf("restored tokens:\n  %+v\nwant\n  %+v", got.tokens, want.tokens)
	}
	if !slices.Equal(got.runners, want.runners) {
		t.Fatalf("restored runners:\n  %+v\nwant\n  %+v", got.runners, want.runners)
	}
	if len(want.tokens) != 3 || len(want.runners) != 2 {
		t.Fatalf("the state compared has %d tokens and %d runners, want 3 and 2", len(want.tokens), len(want.runners))
	}
	subj, err := verifier.NewResolver(nil, st).Resolve(t.Context(), want.live, verifier.SubjectRunner)
	if err != nil || subj.ID != "build-01" {
		t.Fatalf("a live token in the restored copy: %+v, %v", subj, err)
	}
	if v, err := st.SchemaVersion(t.Context()); err != nil || v != store.SchemaVersionWanted() {
		t.Fatalf("restored schema version %d (%v), want %d", v, err, store.SchemaVersionWanted())
	}
}

// SQLite: Backup (VACUUM INTO) while the store is open and writing, then the
// copy opened with the store holds the same tokens and Runners; restoring
// is putting the copy in place of the database while nothing has it open.
func TestSQLiteBackupRestore(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, dbPath, dbURL, clock := sqliteInDataDir(t, dir)
	want := writeBackupState(t, st, clock)

	backup := filepath.Join(dir, "compass-backup.db")
	v, err := store.Backup(ctx, dbURL, backup)
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}
	if v != store.SchemaVersionWanted() {
		t.Fatalf("Backup reports schema version %d, want %d", v, store.SchemaVersionWanted())
	}
	fi, err := os.Stat(backup)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file mode %v, want 0600", fi.Mode().Perm())
	}
	// Written after the backup: not in it.
	clock.Advance(time.Hour)
	if _, _, err := st.Mint(ctx, verifier.SubjectRunner, "after-backup"); err != nil {
		t.Fatal(err)
	}

	cp, err := store.OpenCurrent(ctx, "sqlite://"+backup)
	if err != nil {
		t.Fatalf("OpenCurrent(backup): %v", err)
	}
	assertRestored(t, cp, want)
	if err := cp.Close(); err != nil {
		t.Fatal(err)
	}

	// Restore: the Server stopped, the copy replaces the database file (and
	// its WAL files, which belong to the replaced database).
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Remove(dbPath + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(dbPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	restored, err := store.OpenCurrent(ctx, dbURL)
	if err != nil {
		t.Fatalf("OpenCurrent(restored): %v", err)
	}
	t.Cleanup(func() { _ = restored.Close() })
	assertRestored(t, restored, want)
}

func TestSQLiteBackupRefuses(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	dbURL := "sqlite://" + filepath.Join(dir, "compass.db")
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })

	// An existing file is never overwritten.
	existing := filepath.Join(dir, "existing.db")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Backup(ctx, dbURL, existing); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Backup over an existing file: %v, want os.ErrExist", err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Fatalf("Backup changed an existing file: %q", b)
	}
	// No database: ErrNoDatabase, and no backup file left behind.
	to := filepath.Join(dir, "none-backup.db")
	if _, err := store.Backup(ctx, "sqlite://"+filepath.Join(dir, "none.db"), to); !errors.Is(err, store.ErrNoDatabase) {
		t.Fatalf("Backup of a missing database: %v, want ErrNoDatabase", err)
	}
	for _, p := range []string{to, filepath.Join(dir, "none.db")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused Backup left %s: %v", p, err)
		}
	}
	if _, err := store.Backup(ctx, "postgres://u@127.0.0.1:1/db", to); !errors.Is(err, store.ErrBackupUnsupported) {
		t.Fatalf("Backup of a PostgreSQL URL: %v, want ErrBackupUnsupported", err)
	}
	if _, err := store.Backup(ctx, dbURL, ""); err == nil || err.Error() != "store: backup: no file to back up to" {
		t.Fatalf("Backup to \"\": %v", err)
	}
	// A failed copy (its directory is missing) leaves nothing.
	if _, err := store.Backup(ctx, dbURL, filepath.Join(dir, "no-such-dir", "b.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Backup into a missing directory: %v, want os.ErrNotExist", err)
	}
}

// pgBinEnv names the directory of pg_dump and pg_restore when they are
// neither where .ci/postgres.sh finds the server nor on PATH.
const pgBinEnv = "COMPASS_TEST_PG_BIN"

// pgTool finds a PostgreSQL client binary as .ci/postgres.sh finds the
// server's: the newest /usr/lib/postgresql/<version>/bin, then PATH. Missing,
// it skips on a laptop and fails in CI.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	var dirs []string
	if d := os.Getenv(pgBinEnv); d != "" {
		dirs = append(dirs, d)
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(found, func(i, j int) bool { return pgMajor(found[i]) > pgMajor(found[j]) })
	dirs = append(dirs, found...)
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	msg := name + " not found (under " + pgBinEnv + ", /usr/lib/postgresql/*/bin or PATH): bash .ci/postgres.sh installs it"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// pgMajor is the version in /usr/lib/postgresql/<version>/bin.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// newDatabase creates a database of its own on the test server, dropped
// when t ends, and returns its URL.
func newDatabase(t *testing.T, admin, prefix string) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := prefix + hex.EncodeToString(b[:])
	if _, err := rawPostgres(t, admin).Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer func() { _ = c.Close(ctx) }()
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("parse %s: %v", postgresURLEnv, err)
	}
	u.Path = "/" + name
	return u.String()
}

// PostgreSQL: pg_dump -Fc of a migrated database with tokens and Runners,
// pg_restore into a fresh database, and the store opens the restored one at
// the current schema with the same tokens and Runners.
func TestPostgresDumpRestore(t *testing.T) {
	admin := postgresURL(t)
	pgDump, pgRestore := pgTool(t, "pg_dump"), pgTool(t, "pg_restore")
	ctx := t.Context()
	src := newDatabase(t, admin, "compass_dump_src_")
	dst := newDatabase(t, admin, "compass_dump_dst_")

	if _, err := store.Migrate(ctx, src); err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	st, err := store.OpenCurrent(ctx, src, store.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	want := writeBackupState(t, st, clock)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	dump := filepath.Join(t.TempDir(), "compass.dump")
	run := func(name string, args ...string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
	}
	run(pgDump, "--format=custom", "--no-owner", "--file", dump, "--dbname", src)
	run(pgRestore, "--no-owner", "--exit-on-error", "--single-transaction", "--dbname", dst, dump)

	restored, err := store.OpenCurrent(ctx, dst)
	if err != nil {
		t.Fatalf("OpenCurrent(restored database): %v", err)
	}
	t.Cleanup(func() { _ = restored.Close() })
	assertRestored(t, restored, want)
	if got, err := restored.BootstrapTenant(ctx); err != nil || got != "bootstrap" {
		t.Fatalf("restored bootstrap tenant %q, %v", got, err)
	}
}

// failingWriter refuses every write, as a closed pipe does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// BackupTo streams the same copy Backup writes: taken while the store is
// open and writing, it opens as a database with the same tokens and
// Runners. The intermediate file is gone when it returns, whether the copy
// was written, the writer failed or the database was refused; nothing is
// written for a refused database.
func TestSQLiteBackupToStreamsTheCopy(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, dbPath, dbURL, clock := sqliteInDataDir(t, dir)
	t.Cleanup(func() { _ = st.Close() })
	want := writeBackupState(t, st, clock)
	dataFiles := func() []string { return testutil.DirNames(t, filepath.Dir(dbPath)) }
	before := dataFiles()

	var buf bytes.Buffer
	v, err := store.BackupTo(ctx, dbURL, &buf)
	if err != nil || v != store.SchemaVersionWanted() {
		t.Fatalf("BackupTo: version %d, %v; want %d", v, err, store.SchemaVersionWanted())
	}
	if after := dataFiles(); !slices.Equal(after, before) {
		t.Fatalf("BackupTo left files beside the database: %v, before %v", after, before)
	}
	copyPath := filepath.Join(dir, "streamed.db")
	if err := os.WriteFile(copyPath, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := store.OpenCurrent(ctx, "sqlite://"+copyPath)
	if err != nil {
		t.Fatalf("OpenCurrent(streamed copy): %v", err)
	}
	t.Cleanup(func() { _ = cp.Close() })
	assertRestored(t, cp, want)

	if _, err := store.BackupTo(ctx, dbURL, failingWriter{}); err == nil || !strings.Contains(err.Error(), "store: backup: write the copy: broken pipe") {
		t.Fatalf("BackupTo a failing writer: %v", err)
	}
	if after := dataFiles(); !slices.Equal(after, before) {
		t.Fatalf("a failed BackupTo left files beside the database: %v, before %v", after, before)
	}
	for _, tc := range []struct {
		url  string
		want error
	}{
		{"sqlite://" + filepath.Join(dir, "data", "none.db"), store.ErrNoDatabase},
		{"postgres://u@127.0.0.1:1/db", store.ErrBackupUnsupported},
		{"sqlite://:memory:", store.ErrInvalidURL},
	} {
		var out bytes.Buffer
		if _, err := store.BackupTo(ctx, tc.url, &out); !errors.Is(err, tc.want) || out.Len() != 0 {
			t.Fatalf("BackupTo(%s): %v, %d bytes written; want %v and nothing", tc.url, err, out.Len(), tc.want)
		}
	}
	if after := dataFiles(); !slices.Equal(after, before) {
		t.Fatalf("a refused BackupTo left files beside the database: %v, before %v", after, before)
	}
}
