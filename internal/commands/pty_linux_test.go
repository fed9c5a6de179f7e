package commands_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"github.com/compass-runner/identity/internal/cli"
	"github.com/compass-runner/identity/internal/commands"
)

// openPTY opens a pseudo-terminal pair and returns its terminal end, both
// closed with the test: the stdout of an operator at a shell.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = ptmx.Close() })
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("TIOCGPTN: %v", e)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatalf("TIOCSPTLCK: %v", e)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	return pts
}

// backup --to - refuses a terminal as stdout before it reads the database:
// exit 2, one line saying to redirect it, nothing left in the data
// directory.
func TestBackupToStdoutRefusesATerminal(t *testing.T) {
	pts := openPTY(t)
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
