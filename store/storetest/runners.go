package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

func testEnrollment(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	id := verifier.WorkloadRunnerID("prod-eks", "ip-10-0-1-5.ec2.internal")
	e := store.Enrollment{
		RunnerID: id, Method: store.MethodProjected, Cluster: "prod-eks",
		NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "node-uid-1", PodName: "compass-runner-abcde", PodUID: "pod-uid-1",
		Version: "v1.4.0", Hostname: "ip-10-0-1-5",
	}
	t0 := clock.Now()

	// First enrollment, at the store's clock (At is zero).
	res, err := st.RecordEnrollment(ctx, e)
	if err != nil {
		t.Fatalf("RecordEnrollment #1: %v", err)
	}
	if res != (store.EnrollResult{FirstEnrollment: true}) {
		t.Fatalf("RecordEnrollment #1 = %+v, want first enrollment only", res)
	}
	want := store.Runner{
		ID: id, Tenant: bootstrap(t, st), Method: store.MethodProjected, Cluster: "prod-eks",
		NodeName: e.NodeName, NodeUID: "node-uid-1", PodName: e.PodName, PodUID: "pod-uid-1",
		Version: "v1.4.0", Hostname: "ip-10-0-1-5",
		FirstEnrolledAt: stored(t0), LastEnrolledAt: stored(t0),
	}
	assertRunner(t, st, want)

	// The pod restarts on the same node, upgraded: a later enrollment, given
	// time, reporting a new version.
	e.PodName, e.PodUID, e.Version = "compass-runner-fghij", "pod-uid-2", "v1.5.0"
	t1 := t0.Add(10 * time.Minute)
	e.At = t1
	res, err = st.RecordEnrollment(ctx, e)
	if err != nil {
		t.Fatalf("RecordEnrollment #2: %v", err)
	}
	if res != (store.EnrollResult{PreviousNodeUID: "node-uid-1"}) {
		t.Fatalf("RecordEnrollment #2 = %+v, want not first, node UID unchanged", res)
	}
	want.PodName, want.PodUID, want.Version, want.LastEnrolledAt = e.PodName, e.PodUID, "v1.5.0", stored(t1)
	assertRunner(t, st, want)

	// The node is rebuilt under the same name: a new node UID.
	e.NodeUID = "node-uid-2"
	t2 := t1.Add(time.Hour)
	e.At = t2
	res, err = st.RecordEnrollment(ctx, e)
	if err != nil {
		t.Fatalf("RecordEnrollment #3: %v", err)
	}
	if res != (store.EnrollResult{NodeUIDChanged: true, PreviousNodeUID: "node-uid-1"}) {
		t.Fatalf("RecordEnrollment #3 = %+v, want node UID changed from node-uid-1", res)
	}
	want.NodeUID, want.LastEnrolledAt = "node-uid-2", stored(t2)
	assertRunner(t, st, want)

	// The same ID then enrolls with a minted token: no node UID, no change reported.
	t3 := t2.Add(time.Hour)
	res, err = st.RecordEnrollment(ctx, store.Enrollment{RunnerID: id, Method: store.MethodMinted, At: t3})
	if err != nil {
		t.Fatalf("RecordEnrollment #4: %v", err)
	}
	if res != (store.EnrollResult{PreviousNodeUID: "node-uid-2"}) {
		t.Fatalf("RecordEnrollment #4 = %+v, want no change for an enrollment without a node UID", res)
	}
	want = store.Runner{ID: id, Tenant: want.Tenant, Method: store.MethodMinted,
		FirstEnrolledAt: stored(t0), LastEnrolledAt: stored(t3)}
	assertRunner(t, st, want)

	// A second Runner; ListRunners orders by ID.
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "a-minted-runner", Method: store.MethodMinted, At: t3}); err != nil {
		t.Fatalf("RecordEnrollment(second runner): %v", err)
	}
	list, err := st.ListRunners(ctx)
	if err != nil {
		t.Fatalf("ListRunners: %v", err)
	}
	if len(list) != 2 || list[0].ID != "a-minted-runner" || list[1] != want {
		t.Fatalf("ListRunners = %+v, want a-minted-runner then %+v", list, want)
	}
	if _, err := st.GetRunner(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetRunner(unknown) error = %v, want ErrNotFound", err)
	}
}

func assertRunner(t *testing.T, st store.Store, want store.Runner) {
	t.Helper()
	got, err := st.GetRunner(t.Context(), want.ID)
	if err != nil {
		t.Fatalf("GetRunner(%q): %v", want.ID, err)
	}
	if got != want {
		t.Fatalf("GetRunner(%q) =\n  %+v\nwant\n  %+v", want.ID, got, want)
	}
}

func testEnrollmentRejects(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	for _, tc := range []struct {
		name string
		e    store.Enrollment
	}{
		{"empty runner ID", store.Enrollment{Method: store.MethodMinted}},
		{"runner ID with dot", store.Enrollment{RunnerID: "a.b", Method: store.MethodMinted}},
		{"runner ID with wildcard", store.Enrollment{RunnerID: "a>", Method: store.MethodMinted}},
		{"runner ID too long", store.Enrollment{RunnerID: strings.Repeat("r", store.MaxRunnerIDLen+1), Method: store.MethodMinted}},
		{"unknown method", store.Enrollment{RunnerID: "r1", Method: "password"}},
		{"empty method", store.Enrollment{RunnerID: "r1"}},
		{"node name too long", store.Enrollment{RunnerID: "r1", Method: store.MethodProjected, NodeName: strings.Repeat("n", store.MaxEnrollmentFieldLen+1)}},
		{"version too long", store.Enrollment{RunnerID: "r1", Method: store.MethodMinted, Version: strings.Repeat("v", store.MaxReportedLen+1)}},
		{"hostname with an escape sequence", store.Enrollment{RunnerID: "r1", Method: store.MethodMinted, Hostname: "host\x1b[31m"}},
		{"hostname not UTF-8", store.Enrollment{RunnerID: "r1", Method: store.MethodMinted, Hostname: "host\xff"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.RecordEnrollment(t.Context(), tc.e)
			if !errors.Is(err, verifier.ErrInvalidArgument) {
				t.Fatalf("RecordEnrollment error = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if list, err := st.ListRunners(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("after refused enrollments ListRunners = %+v, %v; want none", list, err)
	}
}

func testTouchRunner(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	if err := st.TouchRunner(ctx, "r1", clock.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("TouchRunner(unknown) error = %v, want ErrNotFound", err)
	}
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "r1", Method: store.MethodMinted}); err != nil {
		t.Fatal(err)
	}
	seen := func(want time.Time) {
		t.Helper()
		rn, err := st.GetRunner(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if !rn.LastSeenAt.Equal(want) || (!want.IsZero() && rn.LastSeenAt.Location() != time.UTC) {
			t.Fatalf("LastSeenAt = %v, want %v", rn.LastSeenAt, want)
		}
	}
	seen(time.Time{})
	t1 := clock.Now().Add(time.Minute)
	for _, step := range []struct {
		at   time.Time
		want time.Time
	}{
		{t1, stored(t1)},
		{t1.Add(-30 * time.Second), stored(t1)}, // an older event does not move it back
		{t1.Add(time.Hour), stored(t1.Add(time.Hour))},
	} {
		if err := st.TouchRunner(ctx, "r1", step.at); err != nil {
			t.Fatalf("TouchRunner(%v): %v", step.at, err)
		}
		seen(step.want)
	}
	// A zero time means the store's clock, which is behind the last event here.
	if err := st.TouchRunner(ctx, "r1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	seen(stored(t1.Add(time.Hour)))
	clock.Advance(2 * time.Hour)
	if err := st.TouchRunner(ctx, "r1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	seen(stored(clock.Now()))
}
