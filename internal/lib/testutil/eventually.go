package testutil

import (
	"testing"
	"time"
)

// pollTick is how often Eventually asks again.
const pollTick = 10 * time.Millisecond

// Eventually polls cond every few milliseconds until it holds, and fails the
// test, saying what it waited for, if it does not within timeout. It is for
// what another goroutine or process changes without an event to wait on
// (route gossip, a counter written asynchronously, a metric); what reads as
// the end of "waiting for ...". Call it from the test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollTick)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}
