package commands_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
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
	if code, _, stderr := runServer(t, nil, "migrate", "--data-dir", dir); code != 0 {
		t.Fatalf("migrate: code %d, stderr %q", code, stderr)
	}
	return dir
}

// mintRunnerToken runs mint-runner-token for id on the data dir and
// returns the token it prints.
func mintRunnerToken(t *testing.T, dir, id string) string {
	t.Helper()
	code, stdout, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", id, "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-runner-token: code %d: %s", code, stderr)
	}
	return strings.TrimSpace(stdout)
}

// listDir names what is in dir, for "nothing was created" checks.
var listDir = testutil.DirNames

// migrate says from which schema version to which, creates the SQLite
// database when there is none, and has nothing to do when run again.
func TestMigrateCommand(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "compass.db")
	wanted := store.SchemaVersionWanted()
	code, stdout, stderr := runServer(t, nil, "migrate", "--data-dir", filepath.Join(dir, "data"))
	if want := fmt.Sprintf("migrated the SQLite database %s from schema version 0 to %d\n", db, wanted); code != 0 || stdout != want || stderr != "" {
		t.Fatalf("migrate: code %d, stdout %q (want %q), stderr %q", code, stdout, want, stderr)
	}
	code, stdout, _ = runServer(t, nil, "migrate", "--database-url", "sqlite://"+db)
	if want := fmt.Sprintf("the SQLite database %s is at schema version %d: nothing to migrate\n", db, wanted); code != 0 || stdout != want {
		t.Fatalf("migrate again: code %d, stdout %q, want %q", code, stdout, want)
	}
	var rows int
	if err := storetest.RawSQLite(t, "sqlite://"+db).QueryRowContext(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&rows); err != nil || rows != wanted {
		t.Fatalf("schema_migrations: %d rows (%v), want %d", rows, err, wanted)
	}
	// An unknown scheme is a failure with the reason.
	code, _, stderr = runServer(t, nil, "migrate", "--database-url", "mysql://u@h/db")
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
		code, stdout, stderr := runServer(t, nil, args...)
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
	case v == wanted-1 && wanted == 5:
		stmts = []string{`DROP TABLE runner_quarantine`, `DELETE FROM schema_migrations WHERE version = 5`}
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
			{"clear-quarantine", "--runner-id", "build-01", "--data-dir", dir},
		}
	}

	behind := migrated(t)
	setSchema(t, behind, wanted-1)
	want := fmt.Sprintf("compass-server: server: store: the sqlite database is at schema version %d and this binary wants %d: run compass-server migrate\n", wanted-1, wanted)
	for _, args := range commands(behind) {
		if code, stdout, stderr := runServer(t, nil, args...); code != 1 || stdout != "" || stderr != want {
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
		if code, stdout, stderr := runServer(t, nil, args...); code != 1 || stdout != "" || stderr != want {
			t.Fatalf("%q on schema %d: code %d, stdout %q, stderr %q; want %q", args, wanted+1, code, stdout, stderr, want)
		}
	}

	// serve: ahead refused, with the same reason.
	certFile, keyFile, _ := servertest.TLS(t, t.TempDir())
	code, _, stderr := runServerWithin(t, refuseWithin, nil, "serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--data-dir", ahead)
	wantServe := fmt.Sprintf("compass-server: server: store: the sqlite database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary\n", wanted+1, wanted)
	if code != 1 || !strings.HasSuffix(stderr, wantServe) {
		t.Fatalf("serve on a newer schema: code %d, stderr %q; want it to end %q", code, stderr, wantServe)
	}
	// serve: an SQLite database behind it is refused too, and left as it
	// is: migrating is the operator's deliberate step (docs/store.md).
	wantServe = fmt.Sprintf("compass-server: server: store: the sqlite database is at schema version %d and this binary wants %d: run compass-server migrate (back up the database first: docs/store.md, Upgrading)\n", wanted-1, wanted)
	code, _, stderr = runServerWithin(t, refuseWithin, nil, "serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--data-dir", behind)
	if code != 1 || !strings.HasSuffix(stderr, wantServe) {
		t.Fatalf("serve on an SQLite schema behind it: code %d, stderr %q; want it to end %q", code, stderr, wantServe)
	}
	if n := schemaRows(t, behind); n != wanted-1 {
		t.Fatalf("serve changed schema_migrations: %d rows, want %d", n, wanted-1)
	}
	// A data dir without a database: serve creates it, and says so.
	var logs testlog.Buffer
	fresh := t.TempDir()
	si, done, cancel := servertest.Serve(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: fresh,
		Logger: slogText(&logs)})
	if si.DoorAddr == "" {
		t.Fatalf("serve on a new data dir: %v", <-done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantLog := fmt.Sprintf(`msg="server: created the database" database="the SQLite database %s" schema_version=%d`, filepath.Join(fresh, "compass.db"), wanted)
	if !strings.Contains(logs.String(), wantLog) {
		t.Fatalf("serve's log does not say %s:\n%s", wantLog, logs.String())
	}
}

// On PostgreSQL serve never migrates: on a schema behind it, it refuses to
// start until compass-server migrate has run; the operator commands refuse
// too, then work.
func TestServeOnPostgresRefusesUntilMigrated(t *testing.T) {
	pg := storetest.PostgresSchema(t, "servertest")
	wanted := store.SchemaVersionWanted()
	certFile, keyFile, _ := servertest.TLS(t, t.TempDir())
	serveArgs := []string{"serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--database-url", pg}
	want := fmt.Sprintf("compass-server: server: store: the postgres database has no schema yet (version 0) and this binary wants %d: run compass-server migrate\n", wanted)
	if code, _, stderr := runServer(t, nil, serveArgs...); code != 1 || !strings.HasSuffix(stderr, want) {
		t.Fatalf("serve on an empty PostgreSQL database: code %d, stderr %q; want it to end %q", code, stderr, want)
	}
	if code, _, stderr := runServer(t, nil, "list-tokens", "--database-url", pg); code != 1 || stderr != want {
		t.Fatalf("list-tokens on an empty PostgreSQL database: code %d, stderr %q", code, stderr)
	}
	u, _ := url.Parse(pg)
	code, stdout, stderr := runServer(t, nil, "migrate", "--database-url", pg)
	wantOut := fmt.Sprintf("migrated the PostgreSQL database %s on %s from schema version 0 to %d\n", strings.TrimPrefix(u.Path, "/"), u.Host, wanted)
	if code != 0 || stdout != wantOut {
		t.Fatalf("migrate: code %d, stdout %q (want %q), stderr %q", code, stdout, wantOut, stderr)
	}
	if code, _, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", "build-01", "--database-url", pg); code != 0 {
		t.Fatalf("mint after migrate: %s", stderr)
	}
	si, done, cancel := servertest.Serve(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DatabaseURL: pg})
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
	tok := mintRunnerToken(t, dir, "build-01")
	st := servertest.OpenStore(t, dir) // held open: the backup is taken beside a user
	to := filepath.Join(t.TempDir(), "compass-backup.db")
	code, stdout, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", to)
	want := fmt.Sprintf("backed up the SQLite database %s (schema version %d) to %s\n", filepath.Join(dir, "compass.db"), store.SchemaVersionWanted(), to)
	if code != 0 || stdout != want {
		t.Fatalf("backup: code %d, stdout %q (want %q), stderr %q", code, stdout, want, stderr)
	}
	orig, err := st.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_, list, _ := runServer(t, nil, "list-tokens", "--database-url", "sqlite://"+to)
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
	existsMsg := "compass-server: --to " + to + ": the file exists, and a backup never overwrites one: name a new file, or - for stdout\n"
	if code, _, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", to); code != 1 || stderr != existsMsg {
		t.Fatalf("backup over an existing file: code %d, stderr %q; want exit 1 and %q", code, stderr, existsMsg)
	}
	if after, _ := os.ReadFile(to); string(after) != string(before) {
		t.Fatal("backup overwrote an existing file")
	}
	code, _, stderr = runServer(t, nil, "backup", "--database-url", "postgres://u@127.0.0.1:1/db", "--to", filepath.Join(t.TempDir(), "x"))
	if code != 1 || stderr != "compass-server: server: store: backup: a PostgreSQL database is backed up with pg_dump -Fc and restored with pg_restore\n" {
		t.Fatalf("backup of PostgreSQL: code %d, stderr %q", code, stderr)
	}
}

// DL-440 W2: minting a Runner token for "a/b" fails ("/" is reserved for
// Kubernetes Runner IDs), through the store and through the CLI.
func TestMintRunnerTokenWithSlashFails(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", "a/b", "--data-dir", dir)
	if code != 2 || stdout != "" || !strings.Contains(stderr, `"/" is reserved`) {
		t.Fatalf("mint-runner-token a/b: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	st := servertest.OpenStore(t, dir)
	if _, _, err := st.Mint(t.Context(), verifier.SubjectRunner, "a/b"); !errors.Is(err, verifier.ErrInvalidArgument) {
		t.Fatalf("Mint(runner, a/b) = %v, want ErrInvalidArgument", err)
	}
	if infos, err := st.ListTokens(t.Context()); err != nil || len(infos) != 0 {
		t.Fatalf("tokens after refused mints: %v, %v", infos, err)
	}
	// An account name may contain "/": the reservation is for Runner IDs.
	if _, _, err := st.Mint(t.Context(), verifier.SubjectAccount, "team/a"); err != nil {
		t.Fatalf("Mint(account, team/a): %v", err)
	}
}

// Minting prints the token once, alone on stdout; list-tokens never prints a
// token or a hash.
func TestMintPrintsTokenOnceOnStdout(t *testing.T) {
	dir := migrated(t)
	code, stdout, stderr := runServer(t, nil, "mint-account-token", "--name", "ops", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-account-token: code %d, stderr %q", code, stderr)
	}
	tok := strings.TrimSuffix(stdout, "\n")
	if tok == "" || strings.ContainsAny(tok, " \n\t.") || stdout != tok+"\n" {
		t.Fatalf("stdout is not the token alone on one line")
	}
	if strings.Contains(stderr, tok) {
		t.Fatal("the token also went to stderr")
	}
	st := servertest.OpenStore(t, dir)
	subj, err := verifier.NewResolver(nil, st).Resolve(t.Context(), tok, verifier.SubjectAccount)
	if err != nil || subj.ID != "ops" {
		t.Fatalf("the printed token resolves to %+v, %v", subj, err)
	}
	rtok := mintRunnerToken(t, dir, "build-01")
	code, list, _ := runServer(t, nil, "list-tokens", "--data-dir", dir)
	if code != 0 {
		t.Fatal("list-tokens failed")
	}
	for _, secret := range []string{tok, rtok} {
		h := verifier.HashToken(secret)
		if strings.Contains(list, secret) || strings.Contains(list, hex.EncodeToString(h[:])) || strings.Contains(list, hex.EncodeToString(h[:8])) {
			t.Fatal("list-tokens printed a token or its hash")
		}
	}
	infos, _ := st.ListTokens(t.Context())
	if len(infos) != 2 || !strings.Contains(list, infos[0].ID) || !strings.Contains(list, "build-01") || !strings.Contains(list, "ops") {
		t.Fatalf("list-tokens:\n%s", list)
	}
	// revoke-token by public ID; the token stops resolving.
	if code, _, stderr := runServer(t, nil, "revoke-token", infos[0].ID, "--data-dir", dir); code != 0 {
		t.Fatalf("revoke-token: %s", stderr)
	}
	if _, err := verifier.NewResolver(nil, st).Resolve(t.Context(), tok, verifier.SubjectAccount); !errors.Is(err, verifier.ErrTokenNotFound) {
		t.Fatalf("a revoked token resolves: %v", err)
	}
}

// Flags first, then COMPASS_* environment variables.
func TestFlagsThenEnv(t *testing.T) {
	envDir, flagDir := migrated(t), migrated(t)
	env := map[string]string{"COMPASS_DATA_DIR": envDir}
	if code, _, stderr := runServer(t, env, "mint-runner-token", "--runner-id", "from-env"); code != 0 {
		t.Fatal(stderr)
	}
	if code, _, stderr := runServer(t, env, "mint-runner-token", "--runner-id", "from-flag", "--data-dir", flagDir); code != 0 {
		t.Fatal(stderr)
	}
	// COMPASS_RUNNER_ID stands in for --runner-id.
	if code, _, stderr := runServer(t, map[string]string{"COMPASS_DATA_DIR": envDir, "COMPASS_RUNNER_ID": "id-from-env"}, "mint-runner-token"); code != 0 {
		t.Fatal(stderr)
	}
	subjectsIn := func(dir string) []string {
		var ids []string
		infos, err := servertest.OpenStore(t, dir).ListTokens(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range infos {
			ids = append(ids, i.SubjectID)
		}
		return ids
	}
	if got := fmt.Sprint(subjectsIn(envDir)); got != "[from-env id-from-env]" {
		t.Fatalf("env data dir holds %s", got)
	}
	if got := fmt.Sprint(subjectsIn(flagDir)); got != "[from-flag]" {
		t.Fatalf("flag data dir holds %s", got)
	}
}

// --ttl stores the expiry (CreatedAt plus the TTL), the mint commands say
// it, list-tokens shows it, and COMPASS_TTL stands in for the flag.
func TestMintTTLFlag(t *testing.T) {
	dir := migrated(t)
	code, _, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", "ci-job-1", "--ttl", "2h", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-runner-token --ttl 2h: code %d, stderr %q", code, stderr)
	}
	code, _, stderr2 := runServer(t, map[string]string{"COMPASS_TTL": "30m"}, "mint-account-token", "--name", "contractor", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-account-token with COMPASS_TTL: %s", stderr2)
	}
	code, _, stderr3 := runServer(t, nil, "mint-runner-token", "--runner-id", "build-01", "--data-dir", dir)
	if code != 0 {
		t.Fatal(stderr3)
	}
	infos, err := servertest.OpenStore(t, dir).ListTokens(t.Context())
	if err != nil || len(infos) != 3 {
		t.Fatalf("tokens: %v, %v", infos, err)
	}
	byID := map[string]store.TokenInfo{}
	for _, i := range infos {
		byID[i.SubjectID] = i
	}
	for id, ttl := range map[string]time.Duration{"ci-job-1": 2 * time.Hour, "contractor": 30 * time.Minute} {
		i := byID[id]
		if got := i.ExpiresAt.Sub(i.CreatedAt); got != ttl {
			t.Fatalf("%s expires %s after it was minted, want %s", id, got, ttl)
		}
	}
	if !byID["build-01"].ExpiresAt.IsZero() {
		t.Fatalf("a token minted without --ttl expires at %v", byID["build-01"].ExpiresAt)
	}
	ci := byID["ci-job-1"]
	wantErr := `minted runner token ` + ci.ID + ` for "ci-job-1"; it expires at ` + ci.ExpiresAt.Format(time.RFC3339) +
		"; it is shown once and cannot be shown again (revoke with: compass-server revoke-token " + ci.ID + ")\n"
	if stderr != wantErr {
		t.Fatalf("mint-runner-token --ttl stderr %q, want %q", stderr, wantErr)
	}
	if !strings.Contains(stderr3, "; it does not expire;") {
		t.Fatalf("mint-runner-token without --ttl stderr %q", stderr3)
	}
	_, list, _ := runServer(t, nil, "list-tokens", "--data-dir", dir)
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "ID KIND SUBJECT CREATED EXPIRES REVOKED" {
		t.Fatalf("list-tokens:\n%s", list)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		i := byID[f[2]]
		wantExp := "-"
		if !i.ExpiresAt.IsZero() {
			wantExp = i.ExpiresAt.Format(time.RFC3339)
		}
		if len(f) != 6 || f[0] != i.ID || f[4] != wantExp || f[5] != "-" {
			t.Fatalf("list-tokens row %q, want ID %s and EXPIRES %s", line, i.ID, wantExp)
		}
	}
}

// A bad --ttl is a usage error naming the flag and the bound, and stores
// nothing.
func TestMintTTLRefused(t *testing.T) {
	dir := migrated(t)
	for _, tc := range []struct {
		ttl, want string
	}{
		{"0s", "compass-server: --ttl 0s: must be positive (leave --ttl out for a token that does not expire)\n"},
		{"-1h", "compass-server: --ttl -1h: must be positive (leave --ttl out for a token that does not expire)\n"},
		{"500ms", "compass-server: --ttl 500ms: under the minimum of 1s (the NATS user JWT a token is granted expires in whole seconds)\n"},
		{"8785h", "compass-server: --ttl 8785h: over the maximum of 8784h0m0s (366 days; longer is no safer than no expiry and more likely a mistyped unit: leave --ttl out and revoke the token instead)\n"},
		{"7d", "compass-server: --ttl 7d: want a duration such as 30s; the largest unit is h (7d is 168h)\n"},
	} {
		code, stdout, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", "r1", "--ttl", tc.ttl, "--data-dir", dir)
		if code != 2 || stdout != "" || stderr != tc.want {
			t.Fatalf("--ttl %s: code %d, stdout %q, stderr %q; want %q", tc.ttl, code, stdout, stderr, tc.want)
		}
	}
	if infos, err := servertest.OpenStore(t, dir).ListTokens(t.Context()); err != nil || len(infos) != 0 {
		t.Fatalf("refused --ttl stored %v (%v)", infos, err)
	}
	// The bounds themselves are accepted.
	for _, ttl := range []string{"1s", "8784h"} {
		if code, _, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", "r1", "--ttl", ttl, "--data-dir", dir); code != 0 {
			t.Fatalf("--ttl %s: %s", ttl, stderr)
		}
	}
}

// The mint commands' help says what --ttl does and what a second mint for
// the same ID does (testSecondMint in storetest checks that it is so). It
// pins the facts, not the sentences: --ttl is a duration read from
// COMPASS_TTL with no default (without it the token never expires), its
// bounds are store.MinTokenTTL and store.MaxTokenTTL, the NATS user JWT ends
// no later than the expiry, and a second token for an ID stands beside the
// first until revoke-token (list-tokens shows both).
func TestMintHelpSaysTTLAndSecondMint(t *testing.T) {
	for _, name := range []string{"mint-runner-token", "mint-account-token"} {
		code, help, _ := runServer(t, nil, name, "--help")
		if code != cli.ExitOK {
			t.Fatalf("%s --help: exit %d", name, code)
		}
		entry := flagHelpEntry(t, help, "ttl")
		if !strings.HasPrefix(entry, "  --ttl duration ") || !strings.Contains(entry, "(env COMPASS_TTL)") || strings.Contains(entry, "(default") {
			t.Fatalf("%s --help lists --ttl as %q; want a duration read from COMPASS_TTL, with no default", name, entry)
		}
		for _, bound := range []string{store.MinTokenTTL.String(), store.MaxTokenTTL.String()} {
			if !strings.Contains(entry, bound) {
				t.Fatalf("%s --help: --ttl's entry %q lacks the bound %s", name, entry, bound)
			}
		}
		fs, err := cli.Parse(commands.Server, findCommand(t, name), nil, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if def := fs.Lookup("ttl").DefValue; def != "0s" {
			t.Fatalf("%s: --ttl's default is %s; want 0s (no expiry)", name, def)
		}
		// The explanation, whatever its line breaks: the key terms.
		text := strings.Join(strings.Fields(help), " ")
		for _, want := range []string{"never expires", "user JWT", "no later than", "revoke-token", "list-tokens", "beside"} {
			if !strings.Contains(text, want) {
				t.Fatalf("%s --help does not say %q:\n%s", name, want, help)
			}
		}
	}
}
