package commands_test

import (
	"bytes"
	"os"
	"slices"
	"testing"

	"github.com/compass-runner/identity/internal/cli"
	"github.com/compass-runner/identity/internal/commands"
	"github.com/compass-runner/identity/internal/testutil"
)

// backup --to - refuses a terminal as stdout before it reads the database:
// exit 2, one line saying to redirect it, nothing left in the data
// directory.
func TestBackupToStdoutRefusesATerminal(t *testing.T) {
	pts := testutil.PTY(t)
	dir := migrated(t)
	before := listDir(t, dir)
	var stderr bytes.Buffer
	code := cli.Run(t.Context(), commands.Server, []string{"backup", "--data-dir", dir, "--to", "-"}, func(string) string { return "" }, pts, &stderr)
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
