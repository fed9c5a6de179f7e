package testutil

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// errorTB is a cleanupTB that also keeps the errors reported to it.
type errorTB struct {
	*cleanupTB
	errs []string
}

func (e *errorTB) Errorf(f string, a ...any) { e.errs = append(e.errs, fmt.Sprintf(f, a...)) }

// RunUntilCleanup cancels run only at cleanup, and reports an error from
// run or a run that outlives its wait; a run that returns nil passes.
func TestRunUntilCleanupCancelsAtCleanupAndReportsWhatRunDid(t *testing.T) {
	const wait = 200 * time.Millisecond
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	for _, tc := range []struct {
		name    string
		run     func(context.Context) error
		wantErr string
	}{
		{"nil after cancel", func(ctx context.Context) error { <-ctx.Done(); return nil }, ""},
		{"an error after cancel", func(ctx context.Context) error { <-ctx.Done(); return errors.New("drain failed") }, "daemon: drain failed"},
		{"never returns", func(context.Context) error { <-block; return nil }, "daemon did not return within 200ms of its cancel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := &errorTB{cleanupTB: &cleanupTB{TB: t}}
			started := make(chan context.Context, 1)
			RunUntilCleanup(tb, "daemon", wait, func(ctx context.Context) error { started <- ctx; return tc.run(ctx) })
			ctx := <-started
			if ctx.Err() != nil {
				t.Fatal("run's context ended before the cleanup")
			}
			if len(tb.cleanups) != 1 {
				t.Fatalf("%d cleanups registered, want 1", len(tb.cleanups))
			}
			for _, f := range tb.cleanups {
				f()
			}
			if ctx.Err() == nil {
				t.Error("the cleanup did not cancel run's context")
			}
			got := strings.Join(tb.errs, "\n")
			if got != tc.wantErr {
				t.Errorf("reported %q, want %q", got, tc.wantErr)
			}
		})
	}
}
