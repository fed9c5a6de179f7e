package callout

import (
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
)

// An event says whether its request was sealed, answered or dropped.
func TestEventSealed(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-sealed", 0)
	wrongAud := func(c *jwt.AuthorizationRequestClaims) { c.Audience = "someone-else" }
	for _, tc := range []struct {
		name   string
		sealed bool
		mod    func(*jwt.AuthorizationRequestClaims)
		want   Outcome
	}{
		{"plain, authorized", false, nil, OutcomeAuthorized},
		{"sealed, authorized", true, nil, OutcomeAuthorized},
		{"plain, dropped after decoding", false, wrongAud, OutcomeDropped},
		{"sealed, dropped after decoding", true, wrongAud, OutcomeDropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.responder(t, tc.sealed, nil)
			_, req := f.request(t, tok, tc.mod)
			hdr, data := "", []byte(req)
			if tc.sealed {
				hdr, data = f.serverXP, f.seal(t, req)
			}
			_, ev := r.Answer(t.Context(), hdr, data)
			if ev.Outcome != tc.want || ev.Sealed != tc.sealed {
				t.Fatalf("event %s (%s), sealed %v; want %s, sealed %v", ev.Outcome, ev.Reason, ev.Sealed, tc.want, tc.sealed)
			}
		})
	}
	t.Run("sealed, dropped before decoding", func(t *testing.T) {
		r := f.responder(t, true, nil)
		if _, ev := r.Answer(t.Context(), f.serverXP, []byte("not sealed")); ev.Reason != DropUndecryptable || !ev.Sealed {
			t.Fatalf("event %s (%s), sealed %v; want dropped (%s), sealed", ev.Outcome, ev.Reason, ev.Sealed, DropUndecryptable)
		}
	})
}

// The slack histogram and the past-horizon counter see the answers sent to
// the server (authorized, denied, keys unavailable), and only those; each
// event is measured on its own, so that no two mistakes can cancel out.
func TestMetricsCountAnswersOnly(t *testing.T) {
	exp := time.Now().Add(time.Second)
	for _, tc := range []struct {
		ev          Event
		slack, late uint64
	}{
		{Event{Outcome: OutcomeAuthorized, RequestExpiry: exp, PastHorizon: true}, 1, 1},
		{Event{Outcome: OutcomeDenied, RequestExpiry: exp, PastHorizon: true}, 1, 1},
		{Event{Outcome: OutcomeKeysUnavailable, RequestExpiry: exp, PastHorizon: true}, 1, 1},
		{Event{Outcome: OutcomeAuthorized}, 0, 0}, // no request expiry: no slack
		{Event{Outcome: OutcomeError, RequestExpiry: exp, PastHorizon: true}, 0, 0},
		{Event{Outcome: OutcomeDropped, Reason: DropPastHorizon, RequestExpiry: exp, PastHorizon: true}, 0, 0},
	} {
		reg := prometheus.NewRegistry()
		m, err := NewMetrics(reg, func() int64 { return 0 }, func() time.Duration { return 0 })
		if err != nil {
			t.Fatal(err)
		}
		m.Observe(tc.ev)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var slack uint64
		for _, mf := range mfs {
			if mf.GetName() == "compass_callout_answer_slack_seconds" {
				slack = mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		late := uint64(testutil.Counter(t, reg, "compass_callout_answers_past_horizon_total", nil))
		if slack != tc.slack || late != tc.late {
			t.Fatalf("%s (expiry set: %v): slack observed %d, past horizon %d; want %d and %d",
				tc.ev.Outcome, !tc.ev.RequestExpiry.IsZero(), slack, late, tc.slack, tc.late)
		}
	}
}

// With no Workers, New takes four per CPU; with no Queue, the default queue
// group, so that replicas share the requests.
func TestNewDefaults(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, nil)
	if want := 4 * runtime.GOMAXPROCS(0); r.cfg.Workers != want || cap(r.slots) != want {
		t.Fatalf("%d workers (%d slots), want %d", r.cfg.Workers, cap(r.slots), want)
	}
	if r.cfg.Queue != DefaultQueue || DefaultQueue == "" {
		t.Fatalf("queue group %q, want %q", r.cfg.Queue, DefaultQueue)
	}
	r = f.responder(t, false, func(c *Config) { c.Queue = "mine" })
	if r.cfg.Queue != "mine" {
		t.Fatalf("queue group %q, want the configured %q", r.cfg.Queue, "mine")
	}
}

// A refusal is logged with the answer the server was sent, through the
// configured logger.
func TestRefusalLogNamesTheAnswer(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		outcome Outcome
		answer  string
	}{
		{OutcomeDenied, AnswerNotAuthorized},
		{OutcomeKeysUnavailable, AnswerKeysUnavailable},
	} {
		var logs testlog.Buffer
		r := f.responder(t, false, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
		r.observe(t.Context(), Event{Outcome: tc.outcome, Cluster: "dark", Reason: "cause"})
		want, _ := json.Marshal(tc.answer)
		if got := logs.String(); !strings.Contains(got, `"msg":"runner refused"`) || !strings.Contains(got, `"answer":`+string(want)) || !strings.Contains(got, `"cluster":"dark"`) {
			t.Fatalf("%s logged %q, want a refusal with answer %s", tc.outcome, got, want)
		}
	}
}

// NATSLag is the worst connection's lag, and zero before Start.
func TestNATSLagIsTheWorstLane(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, nil)
	if d := r.NATSLag(); d != 0 {
		t.Fatalf("before Start: %v", d)
	}
	now := time.Now()
	lanes := []*lane{{now: func() time.Time { return now }}, {now: func() time.Time { return now }}}
	lanes[0].back(now.Add(-time.Second), now.Add(-900*time.Millisecond)) // 100 ms
	lanes[1].back(now.Add(-time.Second), now.Add(-300*time.Millisecond)) // 700 ms
	r.lanes.Store(&lanes)
	if d := r.NATSLag(); d != 700*time.Millisecond {
		t.Fatalf("NATSLag %v, want the worst lane's 700ms", d)
	}
}
