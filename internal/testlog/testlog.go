// Package testlog holds what the project's tests use to capture logs and
// process output: a buffer that is safe for concurrent writers.
package testlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
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
