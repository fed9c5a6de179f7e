package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// Concurrent use: workers mint, look up, revoke and enroll on one store at
// once; sized to finish in seconds under -race on two cores.
const (
	concurrentWorkers = 8
	tokensPerWorker   = 10
)

func testConcurrentUse(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	res := verifier.NewResolver(nil, st)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first int
		errs  []error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	for w := range concurrentWorkers {
		wg.Go(func() {
			for i := range tokensPerWorker {
				id := fmt.Sprintf("w%d-r%d", w, i)
				tok, info, err := st.Mint(ctx, verifier.SubjectRunner, id)
				if err != nil {
					fail(fmt.Errorf("mint %s: %w", id, err))
					return
				}
				if subj, err := res.Resolve(ctx, tok, verifier.SubjectRunner); err != nil || subj.ID != id {
					fail(fmt.Errorf("resolve %s = %q, %w", id, subj.ID, err))
					return
				}
				if i%2 == 1 {
					if _, err := st.Revoke(ctx, info.ID); err != nil {
						fail(fmt.Errorf("revoke %s: %w", id, err))
						return
					}
				}
				// Every worker enrolls the same Runner; exactly one is first.
				r, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "shared", Method: store.MethodMinted, At: clock.Now()})
				if err != nil {
					fail(fmt.Errorf("record enrollment: %w", err))
					return
				}
				if err := st.TouchRunner(ctx, "shared", clock.Now()); err != nil {
					fail(fmt.Errorf("touch runner: %w", err))
					return
				}
				if r.FirstEnrollment {
					mu.Lock()
					first++
					mu.Unlock()
				}
				if _, err := st.ListTokens(ctx); err != nil {
					fail(fmt.Errorf("list tokens: %w", err))
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	if first != 1 {
		t.Fatalf("%d concurrent enrollments of one new Runner reported FirstEnrollment, want exactly 1", first)
	}
	list, err := st.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	revoked := 0
	for _, tk := range list {
		if tk.Revoked() {
			revoked++
		}
	}
	if len(list) != concurrentWorkers*tokensPerWorker || revoked != concurrentWorkers*tokensPerWorker/2 {
		t.Fatalf("after concurrent use: %d tokens, %d revoked; want %d and %d",
			len(list), revoked, concurrentWorkers*tokensPerWorker, concurrentWorkers*tokensPerWorker/2)
	}
}
