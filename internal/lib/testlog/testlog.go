// Package testlog holds what the project's tests use to capture logs and
// process output: a buffer that is safe for concurrent writers.
package testlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer is an io.Writer safe for concurrent use whose content a test can
// search while writers are still running. The zero value is ready to use.
type Buffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // closed and replaced on every write (nil: no one waits yet)
}

// Write appends p and wakes whoever waits in WaitFor.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return s.b.Write(p)
}

// WaitFor waits until the buffer holds want at least n times, waking on
// every write, and fails the test with the content after timeout.
func (s *Buffer) WaitFor(t testing.TB, timeout time.Duration, want string, n int) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		got := strings.Count(s.b.String(), want)
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the log holds %q %d times after %s, want %d:\n%s", want, got, timeout, n, s.String())
		}
	}
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// JSONRecords returns, in order, the records with message msg from what a
// slog.JSONHandler wrote; a line that is not a JSON object is an error.
func (s *Buffer) JSONRecords(msg string) ([]map[string]any, error) {
	var out []map[string]any
	for line := range strings.Lines(s.String()) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("testlog: log line %q: %w", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out, nil
}
