package testutil

import (
	"os"
	"testing"
)

// DirNames names what is in dir, in directory order (sorted by name), for
// the checks that a command created or left nothing behind.
func DirNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
