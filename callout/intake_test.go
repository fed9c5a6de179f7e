package callout

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/verifier"
)

// heldResolver resolves through next once released; until then every
// Resolve waits (it counts the ones waiting on entered).
type heldResolver struct {
	next    Resolver
	release chan struct{}
	entered chan struct{}
}

func (h *heldResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	h.entered <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
		return verifier.Subject{}, ctx.Err()
	}
	return h.next.Resolve(ctx, tok, want)
}

// plainServer is an in-process nats-server with no auth and a connection to
// it: requests are published to Subject by the test itself, as the server
// would.
func plainServer(t *testing.T) (*server.Server, *nats.Conn) {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return s, nc
}

// When every worker is busy, requests wait on the stack; when the stack is
// full the oldest one goes (dropped: overload), and every other request is
// answered once the workers are free, by the workers. Nothing stays counted
// in flight.
func TestOverloadDropsTheOldestAndAnswersTheRest(t *testing.T) {
	fx := newFixture(t)
	held := &heldResolver{next: fx.resolver, release: make(chan struct{}), entered: make(chan struct{}, 1024)}
	var mu sync.Mutex
	var events []Event
	dropped := make(chan Event, 16)
	r := fx.responder(t, false, func(c *Config) {
		c.Resolver = held
		c.Workers = 1
		c.AnswerHorizon = time.Hour // the held requests stay answerable
		c.Observe = func(ev Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
			if ev.Outcome == OutcomeDropped {
				dropped <- ev
			}
		}
	})
	_, nc := plainServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	if err := r.Start(ctx, nc); err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	answers, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	// One request is handled (held), the worker takes the next and waits
	// for the slot, the stack holds queuePerWorker: the last extra requests
	// evict the oldest waiting ones. Whether the worker took its request
	// before the stack filled is up to the scheduler: extra or extra+1 go.
	const extra = 4
	total := 1 + 1 + queuePerWorker + extra
	for i := range total {
		_, req := fx.request(t, fx.token(t, fmt.Sprintf("node-%d", i), 0), func(c *jwt.AuthorizationRequestClaims) {
			c.Expires = time.Now().Add(time.Hour).Unix()
		})
		if err := nc.PublishRequest(Subject, inbox, []byte(req)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			select { // the slot is taken before anything waits
			case <-held.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the first request never reached the resolver")
			}
		}
	}
	for i := range extra {
		select {
		case ev := <-dropped:
			if ev.Reason != DropOverload || ev.Sealed || ev.Slack != 0 {
				t.Fatalf("dropped: reason %q, sealed %v, slack %s; want %q, plain, none", ev.Reason, ev.Sealed, ev.Slack, DropOverload)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d evictions seen; the others never came (lost before the stack?)", i, extra)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	cancel() // the drain finishes what was taken
	select {
	case <-r.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the responder did not drain")
	}
	if got := r.InFlight(); got != 0 {
		t.Fatalf("in flight %d after every request was handled, want 0", got)
	}
	mu.Lock()
	defer mu.Unlock()
	var ok, drops int
	for _, ev := range events {
		switch {
		case ev.Outcome == OutcomeAuthorized:
			ok++
		case ev.Outcome == OutcomeDropped && ev.Reason == DropOverload:
			drops++
		default:
			t.Fatalf("event %+v", ev)
		}
	}
	if ok+drops != total || drops < extra || drops > extra+1 {
		t.Fatalf("%d authorized and %d dropped of %d, want %d or %d dropped", ok, drops, total, extra, extra+1)
	}
	for i := range ok {
		if _, err := answers.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("answer %d of %d: %v", i+1, ok, err)
		}
	}
}

// Every subscription takes a burst of any size: nats.go's pending limits are
// off, so the server's burst waits in the client instead of being dropped as
// a slow consumer.
//
// Start returns once the server holds every subscription, so the next
// CONNECT is answered.
func TestStartLiftsPendingLimits(t *testing.T) {
	fx := newFixture(t)
	r := fx.responder(t, false, nil)
	srv, nc := plainServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	before := srv.NumSubscriptions()
	if err := r.Start(ctx, nc, nc); err != nil {
		t.Fatal(err)
	}
	if got := srv.NumSubscriptions() - before; got != 2 {
		t.Fatalf("the server holds %d new subscriptions when Start returns, want 2", got)
	}
	if len(r.subs) != 2 {
		t.Fatalf("%d subscriptions for 2 connections", len(r.subs))
	}
	for i, s := range r.subs {
		msgs, bytes, err := s.PendingLimits()
		if err != nil || msgs != -1 || bytes != -1 {
			t.Fatalf("subscription %d: pending limits %d messages, %d bytes (%v); want none", i, msgs, bytes, err)
		}
	}
}

// One probe round on a live connection records the PING's round trip as
// the lane's lag: the clock moves 1 ms a reading, and the round ends the
// probe (the clock cancels it when the PONG is stamped).
func TestProbeRecordsTheRoundTrip(t *testing.T) {
	_, nc := plainServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	now, reads := time.Unix(1_700_000_000, 0), 0
	l := &lane{now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if reads == 2 { // sent, then back: the round is over
			cancel()
		}
		now = now.Add(time.Millisecond)
		return now
	}}
	done := make(chan struct{})
	go func() { l.probe(ctx, nc); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe did not stop")
	}
	if got := l.lag(); got != time.Millisecond {
		t.Fatalf("lag after one round %v, want the round trip, 1ms", got)
	}
}

// A PING that fails records nothing: the lane has no lag to report.
func TestProbeRecordsNoFailedRoundTrip(t *testing.T) {
	_, nc := plainServer(t)
	nc.Close() // every flush fails
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // one round, then the probe ends
	now := time.Unix(1_700_000_000, 0)
	l := &lane{now: func() time.Time { now = now.Add(time.Millisecond); return now }}
	l.probe(ctx, nc)
	if got := l.lag(); got != 0 {
		t.Fatalf("lag after a failed PING %v, want 0", got)
	}
}
