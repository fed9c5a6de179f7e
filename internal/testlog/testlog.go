// Package testlog holds what the project's tests use to capture logs and
// process output: a buffer that is safe for concurrent writers.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use whose content a test can
// search while writers are still running. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
