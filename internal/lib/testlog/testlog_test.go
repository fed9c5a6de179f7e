package testlog

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestJSONRecords(t *testing.T) {
	var b Buffer
	log := slog.New(slog.NewJSONHandler(&b, nil))
	log.Info("a", "n", 1)
	log.Warn("b")
	log.Info("a", "n", 2)
	recs, err := b.JSONRecords("a")
	if err != nil || len(recs) != 2 || recs[0]["n"] != 1.0 || recs[1]["n"] != 2.0 {
		t.Fatalf("records %v, %v", recs, err)
	}
	_, _ = b.Write([]byte("not json\n"))
	if _, err := b.JSONRecords("a"); err == nil {
		t.Fatal("a line that is no JSON was read as a record")
	}
}

// WaitFor returns once a concurrent writer has written the wanted text the
// wanted number of times, and fails the test when it never does.
func TestWaitForWakesOnWrites(t *testing.T) {
	var b Buffer
	go func() {
		for range 3 {
			fmt.Fprintln(&b, "msg=ready")
		}
	}()
	b.WaitFor(t, 10*time.Second, "msg=ready", 3)
	if got := strings.Count(b.String(), "msg=ready"); got != 3 {
		t.Fatalf("after WaitFor: %d lines, want 3", got)
	}

	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }()
		b.WaitFor(ft, 50*time.Millisecond, "msg=never", 1)
	}()
	<-done
	if !ft.failed {
		t.Fatal("WaitFor did not fail on text that never came")
	}
}

// fatalT records a Fatalf and stops the calling goroutine.
type fatalT struct {
	testing.TB
	failed bool
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(string, ...any) {
	f.failed = true
	panic("fatal")
}
