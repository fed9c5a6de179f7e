package testutil

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// DirNames lists files and directories by name, sorted, and nothing for an
// empty directory.
func TestDirNamesListsTheEntriesSorted(t *testing.T) {
	dir := t.TempDir()
	if got := DirNames(t, dir); len(got) != 0 {
		t.Fatalf("empty directory: %v", got)
	}
	for _, name := range []string{"b.db", "a.db-wal"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "c"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, want := DirNames(t, dir), []string{"a.db-wal", "b.db", "c"}; !slices.Equal(got, want) {
		t.Fatalf("DirNames = %v, want %v", got, want)
	}
}
