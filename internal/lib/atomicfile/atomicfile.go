// Package atomicfile replaces a file through a rename, so a reader sees the
// old content or the new, never a partial file: how a kubelet updates a
// projected token, and how the dev stack and the tests write token and CA
// files.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode 0600: it writes a temporary file in
// path's directory (named .token-*, the name it had when it wrote only token
// files) and renames it over path. On an error the temporary file is
// removed and path is unchanged; the error is the file system's, naming the
// file.
func Write(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
