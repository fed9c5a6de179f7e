package callout

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
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

// serveNATS is natsembed.ServeOptions for this package's internal tests,
// which cannot import natsembed (it imports callout): an in-process
// nats-server on opts, ready for connections, shut down when the test ends.
func serveNATS(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return s
}

// plainServer is an in-process nats-server with no auth and a connection to
// it: requests are published to Subject by the test itself, as the server
// would.
func plainServer(t *testing.T) (*server.Server, *nats.Conn) {
	t.Helper()
	s := serveNATS(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
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

// drainFixture is a responder with one worker whose resolver is held and
// whose Observe, on an overload drop, blocks the subscription's callback
// until the gate opens: what the server sends next stays pending inside
// nats.go, as a burst does while the callbacks are busy.
type drainFixture struct {
	fx     *fixture
	r      *Responder
	held   *heldResolver
	gate   chan struct{} // closed: drops no longer block
	gated  chan struct{} // one per callback blocked at the gate
	mu     sync.Mutex
	events []Event
}

func newDrainFixture(t *testing.T, drainWait time.Duration) *drainFixture {
	t.Helper()
	d := &drainFixture{fx: newFixture(t), gate: make(chan struct{}), gated: make(chan struct{}, 16)}
	d.held = &heldResolver{next: d.fx.resolver, release: make(chan struct{}), entered: make(chan struct{}, 1024)}
	d.r = d.fx.responder(t, false, func(c *Config) {
		c.Resolver = d.held
		c.Workers = 1
		c.AnswerHorizon = time.Hour // held requests stay answerable
		c.Observe = func(ev Event) {
			d.mu.Lock()
			d.events = append(d.events, ev)
			d.mu.Unlock()
			if ev.Outcome == OutcomeDropped && ev.Reason == DropOverload {
				select {
				case <-d.gate:
				default:
					d.gated <- struct{}{}
					<-d.gate
				}
			}
		}
	})
	d.r.drainWait = drainWait
	return d
}

// publish sends n requests, each with its own token, answered to inbox.
func (d *drainFixture) publish(t *testing.T, nc *nats.Conn, inbox string, n int) {
	t.Helper()
	for i := range n {
		_, req := d.fx.request(t, d.fx.token(t, fmt.Sprintf("node-%d", i), 0), func(c *jwt.AuthorizationRequestClaims) {
			c.Expires = time.Now().Add(time.Hour).Unix()
		})
		if err := nc.PublishRequest(Subject, inbox, []byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil { // the responder's connection has them
		t.Fatal(err)
	}
}

// blockCallback fills the slot, the worker and the stack from nc, so that a
// request is dropped for overload and its callback blocks at the gate. The
// worker takes its one request from the stack when the scheduler lets it,
// so the burst has one more than it needs: one may stay pending behind the
// blocked request.
func (d *drainFixture) blockCallback(t *testing.T, nc *nats.Conn, inbox string) {
	t.Helper()
	d.publish(t, nc, inbox, 1+1+queuePerWorker+1)
	select {
	case <-d.gated:
	case <-time.After(10 * time.Second):
		t.Fatalf("no callback blocked at the gate; %d in flight, %d events, %d queued", d.r.InFlight(), d.count(func(Event) bool { return true }), d.r.jobs.len())
	}
}

// blockAnotherCallback sends requests one at a time until a second
// subscription's callback blocks: the server hands each request to any
// member of the queue group, so those that go to the blocked one stay
// pending there. It returns how many it sent.
func (d *drainFixture) blockAnotherCallback(t *testing.T, nc *nats.Conn, inbox string) int {
	t.Helper()
	for sent := 1; sent <= 200; sent++ {
		d.publish(t, nc, inbox, 1)
		select {
		case <-d.gated:
			return sent
		case <-time.After(50 * time.Millisecond): // it went to the blocked callback
		}
	}
	t.Fatal("no second callback blocked at the gate")
	return 0
}

// count returns how many events match.
func (d *drainFixture) count(match func(Event) bool) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, ev := range d.events {
		if match(ev) {
			n++
		}
	}
	return n
}

func (d *drainFixture) waitDone(t *testing.T) {
	t.Helper()
	select {
	case <-d.r.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the responder did not drain")
	}
}

// A drain hands over what nats.go had already received: requests pending in
// the client when the drain starts are answered, none dropped as shutting
// down, because the drain waits (up to drainWait) for every subscription to
// deliver them.
func TestDrainAnswersWhatTheClientAlreadyHeld(t *testing.T) {
	d := newDrainFixture(t, drainWait)
	_, nc := plainServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := d.r.Start(ctx, nc); err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	answers, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	d.blockCallback(t, nc, inbox)
	const pending = 20
	d.publish(t, nc, inbox, pending)
	close(d.held.release)
	testutil.Eventually(t, 10*time.Second, "the queued requests to be answered", func() bool { return d.r.InFlight() == 0 })

	draining := d.r.subs[0].StatusChanged(nats.SubscriptionDraining)
	cancel()
	select {
	case <-draining:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription never started draining")
	}
	close(d.gate) // the callback goes on with what nats.go holds
	d.waitDone(t)

	if n := d.count(func(ev Event) bool { return ev.Reason == DropShuttingDown }); n != 0 {
		t.Fatalf("%d requests dropped as shutting down; the drain should have waited for them", n)
	}
	if n := d.count(func(ev Event) bool { return ev.Reason == DropOverload }); n != 1 {
		t.Fatalf("%d overload drops, want the one that blocked the callback", n)
	}
	total := 1 + 1 + queuePerWorker + 1 + pending
	ok := d.count(func(ev Event) bool { return ev.Outcome == OutcomeAuthorized })
	if ok != total-1 {
		t.Fatalf("%d of %d requests authorized, want all but the dropped one", ok, total)
	}
	for i := range ok {
		if _, err := answers.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("answer %d of %d: %v", i+1, ok, err)
		}
	}
}

// A drain waits at most drainWait in all, not drainWait per subscription:
// once it has passed, the drain stops waiting for every subscription, and
// whatever nats.go delivers afterwards is dropped as shutting down (the
// server has given up on it), counted as plain requests.
func TestDrainGivesUpAfterDrainWait(t *testing.T) {
	d := newDrainFixture(t, 50*time.Millisecond)
	_, nc := plainServer(t)
	nc2, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := d.r.Start(ctx, nc, nc2); err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	// Both callbacks blocked: neither subscription can finish its drain.
	published := 1 + 1 + queuePerWorker + 1
	d.blockCallback(t, nc, inbox)
	published += d.blockAnotherCallback(t, nc2, inbox)
	const pending = 10
	d.publish(t, nc, inbox, pending)
	published += pending
	before := d.count(func(Event) bool { return true })

	cancel()
	testutil.Eventually(t, 10*time.Second, "the drain to stop waiting for the subscriptions", d.r.stopping.Load)
	close(d.held.release)
	close(d.gate)
	d.waitDone(t)
	// Callbacks still deliver what nats.go holds after Done: each request
	// ends as one event.
	testutil.Eventually(t, 10*time.Second, "an event for every request", func() bool { return d.count(func(Event) bool { return true }) == published })

	d.mu.Lock()
	late := d.events[before:]
	d.mu.Unlock()
	var shut int
	for _, ev := range late {
		switch {
		case ev.Outcome == OutcomeAuthorized: // queued before the drain gave up
		case ev.Outcome == OutcomeDropped && ev.Reason == DropShuttingDown:
			shut++
			if ev.Sealed {
				t.Fatalf("a plain request dropped while draining counted as sealed: %+v", ev)
			}
		default:
			t.Fatalf("after the drain began: %+v", ev)
		}
	}
	if shut < pending {
		t.Fatalf("%d requests dropped as shutting down, want at least the %d still pending in nats.go", shut, pending)
	}
}

// Start records each connection's lag from the flush that confirms its
// subscription, so the lag is known from the first request on, before the
// connection's probe has completed a round.
func TestStartRecordsTheFirstLag(t *testing.T) {
	fx := newFixture(t)
	r := fx.responder(t, false, nil)
	srv, _ := plainServer(t)
	const delay = 300 * time.Millisecond
	// A connection whose server side is behind by delay.
	proxy := testutil.StartProxy(t, srv.Addr().String(), delay)
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := r.Start(ctx, nc); err != nil {
		t.Fatal(err)
	}
	// The probe's first PING has been out for a moment only; the lag is the
	// start-up round trip.
	if got := r.NATSLag(); got < delay {
		t.Fatalf("lag %s right after Start, want at least the connection's %s", got, delay)
	}
}

// A connection that reconnects does not carry its outage into its lag: no
// PING waits in nats.go's reconnect buffer, so the first round trip after
// the reconnect is the server's, not the time the connection was down.
func TestProbeIgnoresTheOutage(t *testing.T) {
	srv, _ := plainServer(t)
	addr := srv.Addr().(*net.TCPAddr)
	const outage = 1500 * time.Millisecond // at least nats.go's wait before it reconnects
	reconnected := make(chan time.Time, 1)
	nc, err := nats.Connect(srv.ClientURL(), nats.ReconnectWait(outage), nats.MaxReconnects(-1),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- time.Now() }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	l := &lane{now: time.Now}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.probe(ctx, nc); close(done) }()
	defer func() { cancel(); <-done }()

	srv.Shutdown()
	srv.WaitForShutdown()
	serveNATS(t, &server.Options{Host: "127.0.0.1", Port: addr.Port, NoLog: true, NoSigs: true})
	var at time.Time
	select {
	case at = <-reconnected:
	case <-time.After(20 * time.Second):
		t.Fatal("no reconnect")
	}
	if lag := l.lag(); lag >= outage/2 {
		t.Fatalf("lag %v as the connection is back: the outage (%v) counted as lag", lag, outage)
	}
	testutil.Eventually(t, 10*time.Second, "a round trip after the reconnect", func() bool { return l.rttAt.Load() > at.UnixNano() })
	if lag := l.lag(); lag >= outage/2 {
		t.Fatalf("lag %v after the first round trip since the reconnect: the outage (%v) counted as lag", lag, outage)
	}
}
