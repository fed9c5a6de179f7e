package callout

import (
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/prometheus/client_golang/prometheus"
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
// the server (authorized, denied, keys unavailable), and only those.
func TestMetricsCountAnswersOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, func() int64 { return 0 }, func() time.Duration { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Second)
	for _, ev := range []Event{
		{Outcome: OutcomeAuthorized, RequestExpiry: exp, PastHorizon: true},
		{Outcome: OutcomeDenied, RequestExpiry: exp, PastHorizon: true},
		{Outcome: OutcomeKeysUnavailable, RequestExpiry: exp, PastHorizon: true},
		{Outcome: OutcomeAuthorized},                                   // no request expiry: no slack
		{Outcome: OutcomeError, RequestExpiry: exp, PastHorizon: true}, // nothing was sent
		{Outcome: OutcomeDropped, Reason: DropPastHorizon, RequestExpiry: exp, PastHorizon: true},
	} {
		m.Observe(ev)
	}
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
	if slack != 3 {
		t.Fatalf("slack observed %d times, want 3 (the answers with an expiry)", slack)
	}
	if got := counter(t, reg, "compass_callout_answers_past_horizon_total", "", ""); got != 3 {
		t.Fatalf("answers past the horizon = %v, want 3 (the answers sent past it)", got)
	}
	if got := counter(t, reg, "compass_callout_dropped_total", "reason", DropPastHorizon); got != 1 {
		t.Fatalf("dropped past_horizon = %v, want 1", got)
	}
}
