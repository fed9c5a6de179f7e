package testutil

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// PTY opens a pseudo-terminal pair and returns its terminal end, closed
// with the test: the stdout of an operator at a shell, for a command that
// must refuse to write bytes meant for a file onto a screen. A machine
// without pseudo-terminals skips the test.
func PTY(t testing.TB) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = ptmx.Close() })
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("testutil: TIOCGPTN: %v", e)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatalf("testutil: TIOCSPTLCK: %v", e)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	return pts
}
