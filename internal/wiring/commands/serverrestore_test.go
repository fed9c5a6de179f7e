package commands_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// mintCLI mints a Runner token with the command and returns the token and
// its public ID (from the stderr line).
func mintCLI(t *testing.T, dir, id string) (token, publicID string) {
	t.Helper()
	code, stdout, stderr := runServer(t, nil, "mint-runner-token", "--runner-id", id, "--data-dir", dir)
	m := regexp.MustCompile(`token ([0-9a-f]{16}) for`).FindStringSubmatch(stderr)
	if code != 0 || m == nil {
		t.Fatalf("mint-runner-token %s: code %d, stderr %q", id, code, stderr)
	}
	return strings.TrimSpace(stdout), m[1]
}

// The documented SQLite restore through the command: serve refuses the
// backup put in place; restore --from re-applies the revocation made after
// the backup, names the lost token by ID and name and never prints a token;
// the kept token resolves and the revoked one does not.
func TestRestoreCommandReappliesRevocations(t *testing.T) {
	dir := migrated(t)
	kept, _ := mintCLI(t, dir, "kept")
	revoked, revokedID := mintCLI(t, dir, "revoked-after")
	backup := filepath.Join(t.TempDir(), "compass-backup.db")
	if code, _, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", backup); code != 0 {
		t.Fatalf("backup: %s", stderr)
	}
	if code, _, stderr := runServer(t, nil, "revoke-token", "--data-dir", dir, revokedID); code != 0 {
		t.Fatalf("revoke-token: %s", stderr)
	}
	lost, lostID := mintCLI(t, dir, "minted-after")

	// serve on the backup itself: refused, saying what to run.
	certFile, keyFile, _ := servertest.TLS(t, t.TempDir())
	backupDir := filepath.Dir(backup)
	if err := os.Rename(backup, filepath.Join(backupDir, "compass.db")); err != nil {
		t.Fatal(err)
	}
	// Bounded: a serve that is not refused runs until its context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var serveErr bytes.Buffer
	code := cli.Run(ctx, commands.Server, []string{"serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--data-dir", backupDir},
		func(string) string { return "" }, io.Discard, &serveErr)
	stderr := serveErr.String()
	if code != 1 || !strings.Contains(stderr, "is a backup taken at") || !strings.Contains(stderr, "compass-server restore --from") {
		t.Fatalf("serve on a backup: code %d, stderr %q", code, stderr)
	}
	backup = filepath.Join(backupDir, "compass.db")

	// A dry run says the same in the conditional and changes nothing.
	dbFile := filepath.Join(dir, "compass.db")
	beforeDry, err := os.ReadFile(dbFile)
	if err != nil {
		t.Fatal(err)
	}
	code, dry, stderr := runServer(t, nil, "restore", "--data-dir", dir, "--from", backup, "--dry-run")
	if code != 0 || !strings.HasPrefix(dry, "dry run, nothing changed: would restore the SQLite database "+dbFile) ||
		!strings.Contains(dry, "would re-apply 1 revocations made after the backup") || !strings.Contains(dry, revokedID) ||
		!strings.Contains(dry, "1 tokens minted after the backup would be lost") || !strings.Contains(dry, lostID) || strings.Contains(dry, "kept at") {
		t.Fatalf("restore --dry-run: code %d, stdout:\n%s\nstderr %q", code, dry, stderr)
	}
	if afterDry, err := os.ReadFile(dbFile); err != nil || string(afterDry) != string(beforeDry) {
		t.Fatalf("restore --dry-run changed the database: %v", err)
	}

	code, stdout, stderr := runServer(t, nil, "restore", "--data-dir", dir, "--from", backup)
	if code != 0 {
		t.Fatalf("restore: code %d, stderr %q", code, stderr)
	}
	for _, want := range []string{
		"restored the SQLite database " + filepath.Join(dir, "compass.db") + " from a backup taken at ",
		"the replaced database is kept at " + filepath.Join(dir, "compass.db.replaced-"),
		"re-applied 1 revocations made after the backup",
		revokedID, "revoked-after",
		"1 tokens minted after the backup are lost",
		lostID, "minted-after",
	} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("restore's output lacks %q:\n%s", want, stdout)
		}
	}
	for _, secret := range []string{kept, revoked, lost} {
		if strings.Contains(stdout+stderr, secret) {
			t.Fatal("restore printed a token")
		}
	}
	st, err := store.OpenServing(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if err != nil {
		t.Fatalf("the restored database is refused for serving: %v", err)
	}
	defer st.Close()
	r := verifier.NewResolver(nil, st)
	if _, err := r.Resolve(t.Context(), kept, verifier.SubjectRunner); err != nil {
		t.Fatalf("the kept token: %v", err)
	}
	for _, tok := range []string{revoked, lost} {
		if _, err := r.Resolve(t.Context(), tok, verifier.SubjectRunner); err == nil {
			t.Fatal("a token revoked or minted after the backup resolves after the restore")
		}
	}
}

// restore's refusals: each says what to do, and none touches the database.
func TestRestoreCommandRefusals(t *testing.T) {
	dir := migrated(t)
	backup := filepath.Join(t.TempDir(), "compass-backup.db")
	if code, _, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", backup); code != 0 {
		t.Fatalf("backup: %s", stderr)
	}
	before := listDir(t, dir)
	lostDir := filepath.Join(t.TempDir(), "lost")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no source", []string{"--data-dir", dir}, 2,
			"compass-server: server: restore: nothing to re-apply the revocations from: give --from BACKUP_FILE (SQLite), or --from-database-url with the database the restored one replaces; if that database is lost, --revoke-every-live-token (or --i-know-revocations-may-be-lost)\n"},
		{"both answers to a lost database", []string{"--data-dir", lostDir, "--from", backup, "--revoke-every-live-token", "--i-know-revocations-may-be-lost"}, 2,
			"--revoke-every-live-token and --i-know-revocations-may-be-lost are two answers to a lost database: choose one"},
		{"an answer to a lost database with one named", []string{"--data-dir", dir, "--from-database-url", "sqlite://" + backup, "--revoke-every-live-token"}, 2,
			"--from-database-url names the replaced database, whose revocations are re-applied"},
		{"revoking every token while the replaced database is there", []string{"--data-dir", dir, "--from", backup, "--revoke-every-live-token"}, 1,
			"--revoke-every-live-token is for a database that is lost"},
		{"--from with a PostgreSQL database", []string{"--database-url", "postgres://u@127.0.0.1:1/db", "--from", backup}, 2,
			"--from takes an SQLite backup file; restore a PostgreSQL dump with pg_restore into a new database"},
		{"--from and --from-database-url", []string{"--data-dir", dir, "--from", backup, "--from-database-url", "sqlite://" + backup}, 2,
			"leave --from-database-url out"},
		{"--from the database itself", []string{"--data-dir", dir, "--from", filepath.Join(dir, "compass.db")}, 1,
			"is the database itself"},
		{"the replaced database lost", []string{"--data-dir", lostDir, "--from", backup}, 1,
			"so the tokens revoked after the backup cannot be revoked again; if it is lost, revoke every token live in the backup with --revoke-every-live-token, or accept that with --i-know-revocations-may-be-lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runServer(t, nil, append([]string{"restore"}, tc.args...)...)
			if code != tc.code || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Fatalf("code %d (want %d), stdout %q, stderr %q; want it to contain %q", code, tc.code, stdout, stderr, tc.want)
			}
		})
	}
	if after := listDir(t, dir); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("refused restores changed the data dir: %v, before %v", after, before)
	}
	if _, err := os.Stat(lostDir); !os.IsNotExist(err) {
		t.Fatalf("a refused restore made %s: %v", lostDir, err)
	}
}

// With the replaced database lost, --i-know-revocations-may-be-lost
// restores anyway, logs it as an error and lists the live tokens to check.
func TestRestoreCommandWithoutTheReplacedDatabase(t *testing.T) {
	dir := migrated(t)
	_, keptID := mintCLI(t, dir, "kept")
	backup := filepath.Join(t.TempDir(), "compass-backup.db")
	if code, _, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", backup); code != 0 {
		t.Fatalf("backup: %s", stderr)
	}
	lostDir := filepath.Join(t.TempDir(), "new")
	code, stdout, stderr := runServer(t, nil, "restore", "--data-dir", lostDir, "--from", backup, "--i-know-revocations-may-be-lost")
	if code != 0 {
		t.Fatalf("restore --i-know-revocations-may-be-lost: code %d, stderr %q", code, stderr)
	}
	if !strings.Contains(stderr, `"level":"ERROR"`) || !strings.Contains(stderr, "every token revoked after the backup is live again") || !strings.Contains(stderr, `"live_tokens":1`) {
		t.Fatalf("the restore without the replaced database was not logged as an error:\n%s", stderr)
	}
	if !strings.Contains(stdout, "NOT compared with the replaced database") || !strings.Contains(stdout, keptID) {
		t.Fatalf("restore's output:\n%s", stdout)
	}
	st, err := store.OpenServing(t.Context(), "sqlite://"+filepath.Join(lostDir, "compass.db"))
	if err != nil {
		t.Fatalf("the restored database is refused for serving: %v", err)
	}
	_ = st.Close()
}

// With the replaced database lost, --revoke-every-live-token restores and
// revokes every token the backup holds live, logs it as a warning and lists
// them for new mints: the restored database serves, and refuses them.
func TestRestoreCommandRevokingEveryLiveToken(t *testing.T) {
	dir := migrated(t)
	kept, keptID := mintCLI(t, dir, "kept")
	backup := filepath.Join(t.TempDir(), "compass-backup.db")
	if code, _, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", backup); code != 0 {
		t.Fatalf("backup: %s", stderr)
	}
	lostDir := filepath.Join(t.TempDir(), "new")
	code, stdout, stderr := runServer(t, nil, "restore", "--data-dir", lostDir, "--from", backup, "--revoke-every-live-token")
	if code != 0 {
		t.Fatalf("restore --revoke-every-live-token: code %d, stderr %q", code, stderr)
	}
	if !strings.Contains(stderr, `"level":"WARN"`) || !strings.Contains(stderr, "every token live in the backup is revoked") || !strings.Contains(stderr, `"revoked_tokens":1`) {
		t.Fatalf("the restore was not logged as a warning:\n%s", stderr)
	}
	if !strings.Contains(stdout, "revoked the 1 tokens live in the backup; mint new ones for their holders") || !strings.Contains(stdout, keptID) {
		t.Fatalf("restore's output:\n%s", stdout)
	}
	st, err := store.OpenServing(t.Context(), "sqlite://"+filepath.Join(lostDir, "compass.db"))
	if err != nil {
		t.Fatalf("the restored database is refused for serving: %v", err)
	}
	defer st.Close()
	m, err := st.LookupTokenHash(t.Context(), verifier.HashToken(kept))
	if err != nil || !m.Revoked {
		t.Fatalf("the backup's live token after the restore: %+v, %v; want it revoked", m, err)
	}
}
