package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/store"
)

// gauges gathers c and returns its samples by name and window.
func gauges(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range m.GetLabel() {
				key += fmt.Sprintf("{%s=%s}", lp.GetName(), lp.GetValue())
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// Runners enrolled and seen, counted from a real SQLite registry: Runners
// whose last event is at generated ages around the windows' edges, and
// Runners never seen. A reading answers scrapes for 15 s; then the registry
// is read again.
func TestRunnerCountsFromTheRegistry(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "compass.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	clock := testutil.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	ages := []time.Duration{0, time.Second, 5*time.Minute - time.Second, 5 * time.Minute, 5*time.Minute + time.Second,
		59 * time.Minute, time.Hour, time.Hour + time.Second, 24 * time.Hour}
	want5m, want1h := 0, 0
	for i, age := range ages {
		id := fmt.Sprintf("runner-%d", i)
		if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: id, Method: store.MethodMinted, At: clock.Now().Add(-48 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if err := st.TouchRunner(ctx, id, clock.Now().Add(-age)); err != nil {
			t.Fatal(err)
		}
		if age <= 5*time.Minute {
			want5m++
		}
		if age <= time.Hour {
			want1h++
		}
	}
	for i := range 3 { // enrolled, never seen
		if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: fmt.Sprintf("quiet-%d", i), Method: store.MethodMinted}); err != nil {
			t.Fatal(err)
		}
	}
	var reads atomic.Int32
	list := func(ctx context.Context) ([]store.Runner, error) {
		reads.Add(1)
		return st.ListRunners(ctx)
	}
	c := newRunnerCounts(ctx, list, clock.Now, slog.New(slog.DiscardHandler))
	want := map[string]float64{
		"compass_server_runners_enrolled":        float64(len(ages) + 3),
		"compass_server_runners_seen{window=5m}": float64(want5m),
		"compass_server_runners_seen{window=1h}": float64(want1h),
	}
	if got := gauges(t, c); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	if want5m != 4 || want1h != 7 {
		t.Fatalf("the generated ages give %d and %d, want the edges counted (4, 7)", want5m, want1h)
	}

	// Within 15 s the reading stands; a new Runner shows after.
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "late", Method: store.MethodMinted}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(runnerCountsMaxAge - time.Second)
	if got := gauges(t, c)["compass_server_runners_enrolled"]; got != want["compass_server_runners_enrolled"] || reads.Load() != 1 {
		t.Fatalf("within the reading's age: enrolled %v after %d reads, want the first reading's", got, reads.Load())
	}
	clock.Advance(time.Second)
	got := gauges(t, c)
	if got["compass_server_runners_enrolled"] != want["compass_server_runners_enrolled"]+1 || reads.Load() != 2 {
		t.Fatalf("after 15 s: enrolled %v after %d reads, want one more Runner", got["compass_server_runners_enrolled"], reads.Load())
	}
	// 15 s later every Runner's last event is 15 s older: the two seen 5
	// minutes ago (and a second less) have left the 5-minute window.
	if got["compass_server_runners_seen{window=5m}"] != float64(want5m-2) {
		t.Fatalf("seen within 5m %v, want %d", got["compass_server_runners_seen{window=5m}"], want5m-2)
	}
}

// A registry that cannot be read exports neither family, so an alert on them
// sees them absent rather than a zero, and says so in the log without what
// the database said beyond its error.
func TestRunnerCountsAbsentWhenTheRegistryFails(t *testing.T) {
	logs := &testlog.Buffer{}
	clock := testutil.NewClock(time.Unix(1_900_000_000, 0))
	fail := true
	c := newRunnerCounts(t.Context(), func(context.Context) ([]store.Runner, error) {
		if fail {
			return nil, errors.New("store: list runners: database is locked")
		}
		return []store.Runner{{ID: "r"}}, nil
	}, clock.Now, slog.New(slog.NewTextHandler(logs, nil)))
	if got := gauges(t, c); len(got) != 0 {
		t.Fatalf("a failed reading exported %v", got)
	}
	if !strings.Contains(logs.String(), "reading the Runner registry failed") || !strings.Contains(logs.String(), "database is locked") {
		t.Fatalf("the failure is not logged:\n%s", logs)
	}
	fail = false
	clock.Advance(runnerCountsMaxAge)
	if got := gauges(t, c); got["compass_server_runners_enrolled"] != 1 {
		t.Fatalf("after the registry recovered: %v", got)
	}
}
