package commands_test

import (
	"bytes"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

// backup --to - refuses a terminal as stdout before it reads the database:
// exit 2, one line saying to redirect it, nothing left in the data
// directory.
func TestBackupToStdoutRefusesATerminal(t *testing.T) {
	pts := testutil.PTY(t)
	dir := migrated(t)
	before := listDir(t, dir)
	var stderr bytes.Buffer
	// A broken guard would write the database into the terminal, which no
	// one reads, and block there: wait a bounded time, then fail by name.
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(t.Context(), commands.Server, []string{"backup", "--data-dir", dir, "--to", "-"}, func(string) string { return "" }, pts, &stderr)
	}()
	var code int
	select {
	case code = <-done:
	case <-time.After(refuseWithin):
		_ = pts.Close() // unblocks the write
		t.Fatalf("backup --to - to a terminal was still running after %s, where it should have refused", refuseWithin)
	}
	want := "compass-server: --to -: stdout is a terminal: redirect it to a file (compass-server backup --to - > compass.db; with kubectl exec, leave out -t)\n"
	if code != cli.ExitUsage || stderr.String() != want {
		t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, stderr.String(), want)
	}
	if after := listDir(t, dir); !slices.Equal(after, before) {
		t.Fatalf("a refused backup left files: %v, before %v", after, before)
	}
	if !cli.IsTerminal(pts) || cli.IsTerminal(&stderr) || cli.IsTerminal(os.NewFile(^uintptr(0), "none")) {
		t.Fatal("IsTerminal tells a pseudo-terminal from a buffer and a closed file wrongly")
	}
}
