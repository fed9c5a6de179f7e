package door

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/grpchealth"
	"golang.org/x/sync/singleflight"
)

// Unauthenticated health checks, however many at once, run the readiness
// check (a store query) one at a time: concurrent checks share one run and
// its answer.
func TestHealthChecksShareOneReadinessRun(t *testing.T) {
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Check(t.Context(), &grpchealth.CheckRequest{})
			if err != nil {
				t.Error(err)
				return
			}
			statuses <- res.Status
		}()
	}
	// Let the first run start, then let it finish.
	deadline := time.After(10 * time.Second)
	for runs.Load() == 0 {
		select {
		case <-deadline:
			t.Fatal("the readiness check never ran")
		case <-time.After(time.Millisecond):
		}
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
	if runs.Load() >= callers {
		t.Fatalf("%d runs for %d concurrent checks: none shared", runs.Load(), callers)
	}
}
