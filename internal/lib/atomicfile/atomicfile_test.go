package atomicfile_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/compass-runner/identity/internal/lib/atomicfile"
)

// Write replaces the file, mode 0600, and leaves no temporary file behind,
// whether it succeeds or fails.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	for _, data := range []string{"first", "second, longer than the first"} {
		if err := atomicfile.Write(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != data {
			t.Fatalf("read back %q, %v; want %q", b, err, data)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
		}
	}
	// Over a directory: the rename fails, the directory stays, and the
	// temporary file is removed.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(sub, []byte("x")); err == nil {
		t.Fatal("Write over a directory succeeded")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("left behind: %v", entries)
	}
	// In a directory that does not exist: the file system's error.
	if err := atomicfile.Write(filepath.Join(dir, "missing", "token"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Write into a missing directory: %v, want fs.ErrNotExist", err)
	}
}
