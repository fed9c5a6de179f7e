package testutil

import (
	"context"
	"testing"
	"time"
)

// RunUntilCleanup runs run in a goroutine of its own until the test ends,
// as a daemon runs until its signal: at cleanup it cancels run's context
// and waits up to wait for run to return. An error from run, or a run
// still going after wait (a drain that never ends), fails the test. The
// context is not the test's own, which ends before cleanups run, so run
// sees its cancel only from here. what names run in the failures.
func RunUntilCleanup(t testing.TB, what string, wait time.Duration, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(wait):
			t.Errorf("%s did not return within %v of its cancel", what, wait)
		}
	})
}
