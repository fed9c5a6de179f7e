package callout

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/verifier"
)

// spyResolver records each call and the time its context had left, and runs
// during (if set) inside the call.
type spyResolver struct {
	inner  Resolver
	during func()

	mu    sync.Mutex
	calls int
	left  []time.Duration // time.Until(ctx's deadline) at each call; -1 without one
}

func (s *spyResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	s.mu.Lock()
	s.calls++
	s.left = append(s.left, left)
	s.mu.Unlock()
	if s.during != nil {
		s.during()
	}
	return s.inner.Resolve(ctx, tok, want)
}

func (s *spyResolver) seen() (int, []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, append([]time.Duration(nil), s.left...)
}

// The numbers of the horizon, written here as numbers: a test that used the
// constants would move with them, and pin nothing.
const (
	wantHorizon = 1800 * time.Millisecond // DefaultAnswerHorizon
	wantReserve = 50 * time.Millisecond   // answerReserve
	wantLeast   = 20 * time.Millisecond   // minRemaining
)

// A request's deadline is the earlier of its exp and its arrival plus the
// answer horizon; the resolver gets until wantReserve before it, on the
// injected clock.
func TestAnswerResolverDeadline(t *testing.T) {
	f := newFixture(t)
	base := time.Unix(time.Now().Unix(), 0) // whole seconds, as exp is
	for _, tc := range []struct {
		name    string
		horizon time.Duration // 0: the default
		exp     time.Duration // after base
		arrived time.Duration // after base; the clock reads base
		left    time.Duration
	}{
		{"horizon nearer", 0, 5 * time.Second, 0, wantHorizon - wantReserve},
		{"exp nearer", 0, time.Second, 0, time.Second - wantReserve},
		{"arrived a second ago", 0, 5 * time.Second, -time.Second, wantHorizon - time.Second - wantReserve},
		{"longer horizon", 3 * time.Second, 5 * time.Second, 0, 3*time.Second - wantReserve},
		{"longer horizon, exp nearer", 10 * time.Second, 5 * time.Second, 0, 5*time.Second - wantReserve},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := testutil.NewClock(base)
			spy := &spyResolver{inner: f.resolver}
			r := f.responder(t, false, func(c *Config) { c.Now, c.Resolver, c.AnswerHorizon = clk.Now, spy, tc.horizon })
			_, req := f.request(t, f.token(t, "node-d", 600*time.Second), func(c *jwt.AuthorizationRequestClaims) {
				c.Expires = base.Add(tc.exp).Unix()
			})
			_, ev := r.answer(t.Context(), base.Add(tc.arrived), "", []byte(req))
			if ev.Outcome != OutcomeAuthorized {
				t.Fatalf("outcome %s (%s)", ev.Outcome, ev.Reason)
			}
			calls, left := spy.seen()
			// The context's deadline is on the real clock: tc.left from the
			// moment the callout set it, a little less when the spy read it.
			const slack = 200 * time.Millisecond // a loaded machine between the two
			if calls != 1 || left[0] > tc.left || left[0] < tc.left-slack {
				t.Fatalf("resolver called %d times with %v left, want once with %v", calls, left, tc.left)
			}
			if ev.Age != -tc.arrived || ev.PastHorizon {
				t.Fatalf("answer age %v (past horizon %v), want %v within the horizon", ev.Age, ev.PastHorizon, -tc.arrived)
			}
		})
	}
}

// A request the callout cannot answer in time any more (its resolver would
// have less than wantLeast before the deadline) is dropped before any
// verification, as expired when exp is the nearer bound, as past its horizon
// otherwise; one just inside is verified and answered.
func TestAnswerDropsRequestsItCannotAnswerInTime(t *testing.T) {
	f := newFixture(t)
	base := time.Unix(time.Now().Unix(), 0)
	// The last arrival (before base, the clock) whose resolver still gets
	// wantLeast under the default horizon.
	edge := wantHorizon - wantReserve - wantLeast
	for _, tc := range []struct {
		name    string
		exp     time.Duration // after base
		at      time.Duration // the clock, after base
		waited  time.Duration // since arrival, at the clock
		outcome Outcome
		reason  string
	}{
		{"waited past the horizon", 5 * time.Second, 0, wantHorizon + time.Millisecond, OutcomeDropped, DropPastHorizon},
		{"waited until wantLeast before the horizon", 5 * time.Second, 0, edge, OutcomeDropped, DropPastHorizon},
		{"waited a little less", 5 * time.Second, 0, edge - 5*time.Millisecond, OutcomeAuthorized, ""},
		{"exp wantLeast away", time.Second, time.Second - wantReserve - wantLeast, 0, OutcomeDropped, DropExpired},
		{"exp a little further", time.Second, time.Second - wantReserve - wantLeast - 5*time.Millisecond, 0, OutcomeAuthorized, ""},
		{"exp past, nearer than the horizon", 0, 0, time.Second, OutcomeDropped, DropExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := testutil.NewClock(base.Add(tc.at))
			spy := &spyResolver{inner: f.resolver}
			reg := prometheus.NewRegistry()
			m, err := NewMetrics(reg, func() int64 { return 0 }, func() time.Duration { return 0 })
			if err != nil {
				t.Fatal(err)
			}
			r := f.responder(t, true, func(c *Config) { c.Now, c.Resolver = clk.Now, spy })
			_, req := f.request(t, f.token(t, "node-e", 600*time.Second), func(c *jwt.AuthorizationRequestClaims) {
				c.Expires = base.Add(tc.exp).Unix()
			})
			resp, ev := r.answer(t.Context(), clk.Now().Add(-tc.waited), f.serverXP, f.seal(t, req))
			m.Observe(ev)
			if ev.Outcome != tc.outcome || ev.Reason != tc.reason {
				t.Fatalf("outcome %s (%s), want %s (%s)", ev.Outcome, ev.Reason, tc.outcome, tc.reason)
			}
			calls, _ := spy.seen()
			if tc.outcome == OutcomeDropped {
				if resp != nil || calls != 0 {
					t.Fatalf("dropped request answered (%d bytes) or resolved (%d calls)", len(resp), calls)
				}
				if got := testutil.Counter(t, reg, "compass_callout_dropped_total", map[string]string{"reason": tc.reason}); got != 1 {
					t.Fatalf("compass_callout_dropped_total{reason=%q} = %v, want 1", tc.reason, got)
				}
				return
			}
			if resp == nil || calls != 1 {
				t.Fatalf("request in time: %d bytes of answer, %d resolver calls", len(resp), calls)
			}
		})
	}
}

// An answer published after the horizon (a resolver that ignores its
// deadline) is still sent, and counted; an answer inside it is not.
func TestAnswerPastHorizonIsCounted(t *testing.T) {
	f := newFixture(t)
	clk := testutil.NewClock(time.Now())
	var took time.Duration // how long the resolver "takes", on the injected clock
	spy := &spyResolver{inner: f.resolver, during: func() { clk.Advance(took) }}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, func() int64 { return 0 }, func() time.Duration { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	r := f.responder(t, false, func(c *Config) { c.Now, c.Resolver = clk.Now, spy })
	for _, tc := range []struct {
		took time.Duration
		past bool
		want float64 // the counter after this answer
	}{
		{DefaultAnswerHorizon, false, 0}, // at the horizon is not past it
		{DefaultAnswerHorizon + time.Millisecond, true, 1},
		{100 * time.Millisecond, false, 1},
		{5 * time.Second, true, 2},
	} {
		took = tc.took
		_, req := f.request(t, f.token(t, "node-f", 600*time.Second), func(c *jwt.AuthorizationRequestClaims) {
			c.Expires = clk.Now().Add(10 * time.Second).Unix()
		})
		resp, ev := r.Answer(t.Context(), "", []byte(req))
		m.Observe(ev)
		if resp == nil || ev.Outcome != OutcomeAuthorized {
			t.Fatalf("took %v: outcome %s (%s)", tc.took, ev.Outcome, ev.Reason)
		}
		if ev.Age != tc.took || ev.PastHorizon != tc.past {
			t.Fatalf("took %v: age %v, past horizon %v; want %v, %v", tc.took, ev.Age, ev.PastHorizon, tc.took, tc.past)
		}
		if got := testutil.Counter(t, reg, "compass_callout_answers_past_horizon_total", nil); got != tc.want {
			t.Fatalf("took %v: compass_callout_answers_past_horizon_total = %v, want %v", tc.took, got, tc.want)
		}
	}
}

func TestNewRefusesShortHorizon(t *testing.T) {
	f := newFixture(t)
	_, err := New(Config{Mode: ModeServerConfig, Resolver: f.resolver, ResponseSigner: f.signer, Account: "A", AnswerHorizon: MinAnswerHorizon - 1})
	if want := "callout: config: AnswerHorizon 99.999999ms is below the minimum 100ms"; err == nil || err.Error() != want {
		t.Fatalf("New = %v, want %q", err, want)
	}
	r, err := New(Config{Mode: ModeServerConfig, Resolver: f.resolver, ResponseSigner: f.signer, Account: "A"})
	if err != nil || r.cfg.AnswerHorizon != DefaultAnswerHorizon {
		t.Fatalf("New with no horizon: %v, horizon %v; want the default %v", err, r.cfg.AnswerHorizon, DefaultAnswerHorizon)
	}
}

// enqueue moves a request's arrival back by its connection's lag: on a lane
// whose last PING took 1.8 s, a request that has just come in is already
// past the 1.8 s horizon and dropped unresolved; on a lane with 1.7 s of lag
// it is resolved and answered.
func TestEnqueueMovesArrivalBackByTheLag(t *testing.T) {
	f := newFixture(t)
	base := time.Unix(time.Now().Unix(), 0)
	for _, tc := range []struct {
		lag     time.Duration
		outcome Outcome
	}{{wantHorizon, OutcomeDropped}, {wantHorizon - wantReserve - wantLeast - 50*time.Millisecond, OutcomeError}} {
		t.Run(tc.lag.String(), func(t *testing.T) {
			clk := testutil.NewClock(base)
			spy := &spyResolver{inner: f.resolver}
			events := make(chan Event, 1)
			r := f.responder(t, false, func(c *Config) {
				c.Now, c.Resolver = clk.Now, spy
				c.Observe = func(ev Event) { events <- ev }
			})
			r.work = t.Context() // as Start sets it
			l := &lane{now: clk.Now}
			l.back(base.Add(-tc.lag), base)
			_, req := f.request(t, f.token(t, "node-l", 600*time.Second), func(c *jwt.AuthorizationRequestClaims) {
				c.Expires = base.Add(time.Minute).Unix()
			})
			// No connection: an answer fails to publish (OutcomeError), which
			// shows it was resolved and signed.
			r.enqueue(&nats.Msg{Subject: Subject, Reply: "_INBOX.lag", Data: []byte(req)}, l)
			ev := <-events
			r.wg.Wait()
			calls, _ := spy.seen()
			if ev.Outcome != tc.outcome || (tc.outcome == OutcomeDropped) != (calls == 0) {
				t.Fatalf("lag %s: outcome %s (%s), %d resolver calls", tc.lag, ev.Outcome, ev.Reason, calls)
			}
			if tc.outcome == OutcomeDropped && (ev.Reason != DropPastHorizon || ev.Slack != 0) {
				t.Fatalf("dropped as %q with slack %s, want %q and none (slack is an answer's)", ev.Reason, ev.Slack, DropPastHorizon)
			}
		})
	}
}
