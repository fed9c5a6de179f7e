// Package bearerfile reads a bearer token from a file, again whenever the
// file changes: the kubelet rotates a projected ServiceAccount token by
// pointing the volume's ..data link at a new directory, so the path names a
// new file (another inode, another mtime). A stat per use is the whole cost
// of noticing. The doors' API-server clients (tokenreview, podwatch) present
// their credential this way.
package bearerfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// File is the token in the file at Path, capped at Max bytes.
type File struct {
	Path string
	Max  int // the longest token accepted, in bytes

	mu    sync.Mutex
	info  os.FileInfo // of the file last read; nil before the first read
	value string
}

// Token returns the file's token, re-reading it if the file is not the one
// last read. Its errors name the file, never its content.
func (f *File) Token() (string, error) {
	fi, err := os.Stat(f.Path)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.info != nil && os.SameFile(f.info, fi) && fi.ModTime().Equal(f.info.ModTime()) && fi.Size() == f.info.Size() {
		return f.value, nil
	}
	v, err := read(f.Path, f.Max)
	if err != nil {
		return "", err
	}
	// fi is from before the read: a change between the two is seen by the
	// next stat, which then differs, and read again.
	f.info, f.value = fi, v
	return v, nil
}

func read(path string, maxBytes int) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, int64(maxBytes)+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxBytes {
		return "", fmt.Errorf("%s is longer than %d bytes", path, maxBytes)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	// A bearer token is visible ASCII; anything else would be refused by
	// net/http as a header value, later and less clearly.
	if strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return "", errors.New(path + " holds a character not allowed in a bearer token")
	}
	return v, nil
}
