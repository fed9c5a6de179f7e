package podwatch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// maxTokenBytes caps the watcher's token file: a projected token is 1-2
// KiB, a legacy Secret's about 1 KiB.
const maxTokenBytes = 16 << 10

// credential is the watcher's own bearer token, read from a file and read
// again whenever the file changes: the kubelet rotates a projected token by
// pointing the volume's ..data link at a new directory, so the path names a
// new file (another inode, another mtime). A stat per request (a list page,
// a watch) is the whole cost of noticing.
type credential struct {
	path string

	mu    sync.Mutex
	info  os.FileInfo // of the file last read; nil before the first read
	value string
}

// token returns the file's token, re-reading it if the file is not the one
// last read. Its errors name the file, never its content.
func (c *credential) token() (string, error) {
	fi, err := os.Stat(c.path)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.info != nil && os.SameFile(c.info, fi) && fi.ModTime().Equal(c.info.ModTime()) && fi.Size() == c.info.Size() {
		return c.value, nil
	}
	v, err := readToken(c.path)
	if err != nil {
		return "", err
	}
	// fi is from before the read: a change between the two is seen by the
	// next request's stat, which then differs, and read again.
	c.info, c.value = fi, v
	return v, nil
}

func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxTokenBytes {
		return "", fmt.Errorf("%s is longer than %d bytes", path, maxTokenBytes)
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
