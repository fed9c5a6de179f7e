package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// openWriter opens a quarantine writer on url with clock, as compass-callout
// does beside its read-only store, and closes it when t ends.
func openWriter(t *testing.T, url string, clock *Clock) store.QuarantineWriter {
	t.Helper()
	w, err := store.OpenQuarantineWriter(t.Context(), url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatalf("OpenQuarantineWriter: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("quarantine writer Close: %v", err)
		}
	})
	return w
}

// testQuarantineBoundary: with 3 in 10 minutes, exactly 3 displacements
// within the window do not quarantine and the fourth does; four spread over
// more than the window do not; a quarantined ID's record no longer moves.
func testQuarantineBoundary(t *testing.T, b Backend) {
	st, clock, url := fresh(t, b)
	w := openWriter(t, url, clock)
	ctx := t.Context()
	p := store.QuarantinePolicy{After: 3, Window: 10 * time.Minute}
	record := func(id string, n int) (store.Quarantine, bool) {
		t.Helper()
		q, started, err := w.RecordDisplacement(ctx, store.Displacement{RunnerID: id, Newer: fmt.Sprintf("10.0.0.2:%d", 40000+n), Older: "10.0.0.1:5000"}, p)
		if err != nil {
			t.Fatalf("RecordDisplacement(%s) #%d: %v", id, n, err)
		}
		return q, started
	}

	first := stored(clock.Now())
	for n := 1; n <= 3; n++ {
		q, started := record("copied", n)
		if started || q.Quarantined() || q.Displacements != n || !q.WindowStart.Equal(first) {
			t.Fatalf("displacement %d of 3: %+v, started %v; want counted, not quarantined", n, q, started)
		}
		clock.Advance(p.Window / 3) // the third is exactly at the window's end
	}
	if qs, err := st.ListQuarantined(ctx); err != nil || len(qs) != 0 {
		t.Fatalf("ListQuarantined after 3 = %+v, %v; want none", qs, err)
	}
	// The fourth, exactly W after the first: within the window.
	clock.Advance(-p.Window / 3)
	clock.Advance(p.Window - 3*(p.Window/3))
	at := stored(clock.Now())
	q, started := record("copied", 4)
	want := store.Quarantine{RunnerID: "copied", WindowStart: first, Displacements: 4, LastAt: at,
		NewerClient: "10.0.0.2:40004", OlderClient: "10.0.0.1:5000", QuarantinedAt: at}
	if !started || q != want {
		t.Fatalf("displacement 4 = %+v, started %v; want %+v, started", q, started, want)
	}
	clock.Advance(time.Second)
	if q, started := record("copied", 5); started || q != want {
		t.Fatalf("a displacement of a quarantined ID = %+v, started %v; want the record unchanged", q, started)
	}
	if got, err := st.GetQuarantine(ctx, "copied"); err != nil || got != want {
		t.Fatalf("GetQuarantine = %+v, %v; want %+v", got, err, want)
	}
	if qs, err := st.ListQuarantined(ctx); err != nil || len(qs) != 1 || qs[0] != want {
		t.Fatalf("ListQuarantined = %+v, %v; want %+v", qs, err, want)
	}

	// Four spread over more than the window: the fourth starts a new one.
	start := stored(clock.Now())
	for n := 1; n <= 3; n++ {
		record("flaky", n)
		clock.Advance(p.Window / 2)
	}
	q, started = record("flaky", 4)
	if started || q.Quarantined() || q.Displacements != 1 || q.WindowStart.Equal(start) || !q.WindowStart.Equal(q.LastAt) {
		t.Fatalf("4 displacements over 1.5 windows = %+v, started %v; want the first of a new window", q, started)
	}

	// Threshold 0 only counts.
	for n := 1; n <= 10; n++ {
		if q, started, err := w.RecordDisplacement(ctx, store.Displacement{RunnerID: "counted"}, store.QuarantinePolicy{}); err != nil || started || q.Quarantined() {
			t.Fatalf("threshold 0, displacement %d: %+v, %v, %v", n, q, started, err)
		}
	}
	if _, err := st.GetQuarantine(ctx, "never-displaced"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetQuarantine(never displaced) = %v; want ErrNotFound", err)
	}
}

// testQuarantineClear: clear-quarantine ends it and resets the count; an ID
// not quarantined is ErrNotFound and its count is left alone.
func testQuarantineClear(t *testing.T, b Backend) {
	st, clock, url := fresh(t, b)
	w := openWriter(t, url, clock)
	ctx := t.Context()
	p := store.QuarantinePolicy{After: 1, Window: time.Minute}
	d := store.Displacement{RunnerID: "r1", Newer: "10.0.0.2:1", Older: "10.0.0.1:1"}
	for range 2 {
		if _, _, err := w.RecordDisplacement(ctx, d, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := w.RecordDisplacement(ctx, store.Displacement{RunnerID: "r2"}, p); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{"r2", `store: not found: runner "r2" is not quarantined`},
		{"unknown", `store: not found: runner "unknown" is not quarantined`},
	} {
		if _, err := st.ClearQuarantine(ctx, tc.id); !errors.Is(err, store.ErrNotFound) || err.Error() != tc.want {
			t.Fatalf("ClearQuarantine(%s) = %v; want %q", tc.id, err, tc.want)
		}
	}
	q, err := st.ClearQuarantine(ctx, "r1")
	if err != nil || !q.Quarantined() || q.Displacements != 2 {
		t.Fatalf("ClearQuarantine(r1) = %+v, %v; want the quarantined record", q, err)
	}
	if qs, err := st.ListQuarantined(ctx); err != nil || len(qs) != 0 {
		t.Fatalf("ListQuarantined after clearing = %+v, %v", qs, err)
	}
	if r2, err := st.GetQuarantine(ctx, "r2"); err != nil || r2.Displacements != 1 {
		t.Fatalf("r2's count after clearing r1 = %+v, %v; want 1", r2, err)
	}
	// Counted afresh.
	if q, started, err := w.RecordDisplacement(ctx, d, p); err != nil || started || q.Displacements != 1 {
		t.Fatalf("first displacement after clearing = %+v, %v, %v; want 1, not quarantined", q, started, err)
	}
}

// testQuarantineRejects: invalid displacements are refused by name.
func testQuarantineRejects(t *testing.T, b Backend) {
	_, clock, url := fresh(t, b)
	w := openWriter(t, url, clock)
	long := string(make([]byte, store.MaxClientAddrLen+1))
	for _, tc := range []struct {
		name string
		d    store.Displacement
		p    store.QuarantinePolicy
		want string
	}{
		{"no ID", store.Displacement{}, store.QuarantinePolicy{}, "store: record displacement: verifier: invalid argument: runner ID empty or longer than 294 bytes"},
		{"long address", store.Displacement{RunnerID: "r", Newer: long}, store.QuarantinePolicy{}, "store: record displacement: verifier: invalid argument: client address longer than 256 bytes"},
		{"negative", store.Displacement{RunnerID: "r"}, store.QuarantinePolicy{After: -1}, "store: record displacement: verifier: invalid argument: threshold -1 is negative"},
		{"no window", store.Displacement{RunnerID: "r"}, store.QuarantinePolicy{After: 3}, "store: record displacement: verifier: invalid argument: window 0s is not positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := w.RecordDisplacement(t.Context(), tc.d, tc.p)
			if !errors.Is(err, verifier.ErrInvalidArgument) || err.Error() != tc.want {
				t.Fatalf("RecordDisplacement = %v; want %q", err, tc.want)
			}
		})
	}
	if _, err := store.OpenQuarantineWriter(t.Context(), url, store.ReadOnly()); err == nil ||
		err.Error() != "store: a quarantine writer cannot be read-only" {
		t.Fatalf("OpenQuarantineWriter(ReadOnly) = %v", err)
	}
}

// testQuarantineShared: two writers on one database (two callout
// replicas) counting one ID at once count every displacement once, and
// exactly one of them starts the quarantine.
func testQuarantineShared(t *testing.T, b Backend) {
	st, clock, url := fresh(t, b)
	writers := []store.QuarantineWriter{openWriter(t, url, clock), openWriter(t, url, clock)}
	const each = 10
	p := store.QuarantinePolicy{After: 2*each - 1, Window: time.Hour}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		starts  int
		errs    []error
		workers = 4
	)
	for i := range workers {
		w := writers[i%2]
		wg.Go(func() {
			for range each / 2 {
				_, started, err := w.RecordDisplacement(t.Context(), store.Displacement{RunnerID: "shared"}, p)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				if started {
					starts++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent RecordDisplacement: %v", errs)
	}
	q, err := st.GetQuarantine(t.Context(), "shared")
	if err != nil || q.Displacements != 2*each || !q.Quarantined() || starts != 1 {
		t.Fatalf("after %d concurrent displacements: %+v, %v, %d starts; want %d counted, quarantined once", 2*each, q, err, starts, 2*each)
	}
}
