package testutil_test

import (
	"testing"

	"golang.org/x/term"

	"github.com/compass-runner/identity/internal/lib/testutil"
)

// PTY's file is a terminal, and a write to it succeeds (the other end is
// open).
func TestPTYIsATerminal(t *testing.T) {
	pts := testutil.PTY(t)
	if !term.IsTerminal(int(pts.Fd())) {
		t.Fatal("PTY's file is not a terminal")
	}
	if _, err := pts.Write([]byte("x")); err != nil {
		t.Fatalf("write to the PTY: %v", err)
	}
}
