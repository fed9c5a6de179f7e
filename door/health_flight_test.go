package door

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"connectrpc.com/grpchealth"
	"golang.org/x/sync/singleflight"
)

// Unauthenticated health checks, however many at once, run the readiness
// check (a store query) one at a time: concurrent checks share one run and
// its answer. In a synctest bubble, so that "at once" is exact: every caller
// is inside Check, durably blocked (the first in the run, the others waiting
// for it), before the run is let go. Released as soon as the first run
// began, as this test once was, the others could arrive one by one after it
// ended and each run again, which a loaded machine did.
func TestHealthChecksShareOneReadinessRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var running, most, runs atomic.Int32
		c := &healthChecker{flight: &singleflight.Group{}, ready: func(context.Context) error {
			n := running.Add(1)
			defer running.Add(-1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			runs.Add(1)
			<-release
			return nil
		}}
		const callers = 32
		var wg sync.WaitGroup
		statuses := make(chan grpchealth.Status, callers)
		for range callers {
			wg.Go(func() {
				res, err := c.Check(t.Context(), &grpchealth.CheckRequest{})
				if err != nil {
					t.Error(err)
					return
				}
				statuses <- res.Status
			})
		}
		synctest.Wait() // every caller blocked: one in the run, the rest on it
		if n := runs.Load(); n != 1 {
			t.Fatalf("%d readiness runs started while %d checks waited, want 1", n, callers)
		}
		close(release)
		wg.Wait()
		close(statuses)
		for s := range statuses {
			if s != grpchealth.StatusServing {
				t.Fatalf("status %v, want SERVING", s)
			}
		}
		if most.Load() != 1 {
			t.Fatalf("%d readiness checks ran at once, want 1", most.Load())
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("%d runs for %d concurrent checks, want the one they all shared", n, callers)
		}
	})
}
