//go:build !linux

package testutil

import (
	"os"
	"testing"
)

// PTY skips the test: pseudo-terminals are opened on Linux only.
func PTY(t testing.TB) *os.File {
	t.Helper()
	t.Skip("pseudo-terminals are opened on Linux only")
	return nil
}
