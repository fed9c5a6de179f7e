package commands_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/store"
)

// backup --to-dir, as the rendered backup CronJob runs it: one copy named by
// its UTC time in the directory, a database with the token minted before.
// --keep out of range and --to beside --to-dir are usage errors.
func TestBackupToDirCommand(t *testing.T) {
	dir := migrated(t)
	mintRunnerToken(t, dir, "build-01")
	out := t.TempDir()
	code, stdout, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to-dir", out, "--keep", "2")
	if code != 0 {
		t.Fatalf("backup --to-dir: exit %d, stderr %q", code, stderr)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !regexp.MustCompile(`^compass-[0-9]{8}T[0-9]{6}Z\.db$`).MatchString(entries[0].Name()) {
		t.Fatalf("backup --to-dir wrote %v, want one compass-<time>.db", entries)
	}
	file := filepath.Join(out, entries[0].Name())
	want := fmt.Sprintf("backed up the SQLite database %s (schema version %d) to %s\n", filepath.Join(dir, "compass.db"), store.SchemaVersionWanted(), file)
	if stdout != want {
		t.Fatalf("backup --to-dir printed %q, want %q", stdout, want)
	}
	cp, err := store.OpenCurrent(t.Context(), "sqlite://"+file)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := cp.ListTokens(t.Context())
	_ = cp.Close()
	if err != nil || len(toks) != 1 || toks[0].SubjectID != "build-01" {
		t.Fatalf("the copy's tokens: %+v, %v", toks, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--to-dir", out, "--keep", "0"}, "compass-server: --keep 0: want 1 to 1000 copies\n"},
		{[]string{"--to-dir", out, "--to", "x.db"}, "compass-server: give --to FILE (or - for stdout) or --to-dir DIR\n"},
	} {
		code, _, stderr := runServer(t, nil, append([]string{"backup", "--data-dir", dir}, tc.args...)...)
		if code != 2 || stderr[:len(tc.want)] != tc.want {
			t.Errorf("backup %v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// The CronJob's --backup-keep is refused where backup --keep would be.
func TestBackupKeepLimitIsTheStores(t *testing.T) {
	if deploy.MaxBackupKeep != store.MaxBackupKeep || store.MinBackupKeep != 1 {
		t.Fatalf("deploy.MaxBackupKeep %d, store.MaxBackupKeep %d, store.MinBackupKeep %d", deploy.MaxBackupKeep, store.MaxBackupKeep, store.MinBackupKeep)
	}
	if deploy.DefaultBackupKeep < store.MinBackupKeep || deploy.DefaultBackupKeep > store.MaxBackupKeep {
		t.Fatalf("deploy.DefaultBackupKeep %d is outside the store's limits", deploy.DefaultBackupKeep)
	}
}
