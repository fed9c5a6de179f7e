package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// The scheduled backup as the rendered CronJob runs it (--backup-schedule):
// its container's arguments and environment, its paths moved under the
// Server pod's test root, with the real binary beside a running serve. The
// copy lands in the backup claim's directory, holds the token minted before,
// and is stamped as a backup (serve refuses it until restore has run).
func TestScheduledBackupAsTheCronJobRunsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server")
	pod := renderServerPod(t)
	_, _, srv := pod.serve(t, bin)
	defer stop(t, srv)
	tok := filepath.Join(t.TempDir(), "ops.token")
	if code, stderr := pod.exec(t, bin, []string{"mint-account-token", "--name", "ops"}, tok, nil); code != 0 {
		t.Fatalf("mint: exit %d, %s", code, stderr)
	}

	p := deploy.DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.BackupSchedule, p.BackupClaim = "0 3 * * *", "compass-backups"
	spec := deploytest.RenderedPod(t, p, "CronJob", deploy.ServerBackupCronJob)
	if len(spec.Containers) != 1 {
		t.Fatalf("the CronJob's pod has %d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	moved := func(path string) string { return filepath.Join(pod.root, path) }
	var args []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "/") {
			a = moved(a)
			if err := os.MkdirAll(a, 0o700); err != nil { // the backup claim's mount
				t.Fatal(err)
			}
		}
		args = append(args, a)
	}
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	cmd := pod.command(t.Context(), bin, args, env)
	if dataDir := pod.get(t, "COMPASS_DATA_DIR"); !slices.Contains(cmd.Env, "COMPASS_DATA_DIR="+dataDir) {
		t.Fatalf("the CronJob's data dir is not the Server's %s: %v", dataDir, cmd.Env)
	}
	var stdout strings.Builder
	cmd.Stdout = &stdout
	code, stderr := exitOf(t, cmd)
	if code != 0 {
		t.Fatalf("compass-server %v as the CronJob runs it: exit %d, %s", args, code, stderr)
	}
	backups := moved("/backup")
	names := testutil.DirNames(t, backups)
	if len(names) != 1 || !strings.HasPrefix(names[0], "compass-") || !strings.HasSuffix(names[0], "Z.db") {
		t.Fatalf("the backup directory holds %v, want one compass-<time>.db", names)
	}
	copyPath := filepath.Join(backups, names[0])
	if !strings.Contains(stdout.String(), "to "+copyPath+"\n") {
		t.Fatalf("the CronJob's run printed %q", stdout.String())
	}
	cp, err := store.OpenCurrent(t.Context(), "sqlite://"+copyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if _, err := verifier.NewResolver(nil, cp).Resolve(t.Context(), testutil.ReadTrim(t, tok), verifier.SubjectAccount); err != nil {
		t.Fatalf("the token minted before the backup is not in the copy: %v", err)
	}
	if _, err := store.OpenServing(t.Context(), "sqlite://"+copyPath); err == nil {
		t.Fatal("the scheduled copy is not stamped as a backup: serve would open it without a restore")
	}
}
