package testutil

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records the failure of a helper run on its own goroutine and ends
// that goroutine, as testing.T's Fatal does.
type fakeTB struct {
	testing.TB
	failure string
}

func (*fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFake runs fn with a fakeTB on its own goroutine and returns what it
// failed with ("" if it returned).
func runFake(t *testing.T, fn func(testing.TB)) string {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the helper neither returned nor failed")
	}
	return f.failure
}

// Eventually returns once cond holds, asking again until it does.
func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int64
	failure := runFake(t, func(tb testing.TB) {
		Eventually(tb, 10*time.Second, "the third call", func() bool { return calls.Add(1) == 3 })
	})
	if failure != "" {
		t.Fatalf("failed: %s", failure)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3 (it returns at the first true)", n)
	}
}

// Eventually fails after the timeout, not before, saying what it waited for
// and for how long.
func TestEventuallyFailsSayingWhatAfterTheTimeout(t *testing.T) {
	const timeout = 150 * time.Millisecond
	var calls atomic.Int64
	start := time.Now()
	failure := runFake(t, func(tb testing.TB) {
		Eventually(tb, timeout, "the moon to turn blue", func() bool { calls.Add(1); return false })
	})
	took := time.Since(start)
	if want := "timed out after 150ms waiting for the moon to turn blue"; failure != want {
		t.Fatalf("failure %q, want %q", failure, want)
	}
	if took < timeout {
		t.Fatalf("failed after %s, before the %s timeout", took, timeout)
	}
	if n := calls.Load(); n < 2 {
		t.Fatalf("cond called %d times in %s; it should be polled every %s", n, timeout, pollTick)
	}
}

// A condition that already holds is asked once.
func TestEventuallyAsksOnceWhenTheConditionHolds(t *testing.T) {
	var calls int
	Eventually(t, time.Nanosecond, "nothing", func() bool { calls++; return true })
	if calls != 1 {
		t.Fatalf("cond called %d times, want 1", calls)
	}
}
