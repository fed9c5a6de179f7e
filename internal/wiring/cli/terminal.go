package cli

import (
	"io"

	"golang.org/x/term"
)

// IsTerminal reports whether w is a terminal: a command whose output is
// bytes for a file (backup --to -) refuses one.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}
