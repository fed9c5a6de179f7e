package horizon

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// gateResolver holds the request for one token until released (or its
// context ends), and counts the calls per token.
type gateResolver struct {
	inner   callout.Resolver
	held    string        // the token held
	entered chan struct{} // closed when the held token's call begins
	release chan struct{} // closing it lets the held call go on
	during  func()        // run by the held call once released, if set

	mu       sync.Mutex
	calls    map[string]int
	returned bool // the held call has returned
}

func newGate(inner callout.Resolver, held string) *gateResolver {
	return &gateResolver{inner: inner, held: held, entered: make(chan struct{}), release: make(chan struct{}), calls: map[string]int{}}
}

func (g *gateResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	g.mu.Lock()
	g.calls[tok]++
	g.mu.Unlock()
	if tok == g.held {
		close(g.entered)
		select {
		case <-g.release:
		case <-ctx.Done():
		}
		if g.during != nil {
			g.during()
		}
		defer func() {
			g.mu.Lock()
			g.returned = true
			g.mu.Unlock()
		}()
	}
	return g.inner.Resolve(ctx, tok, want)
}

func (g *gateResolver) heldReturned() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.returned
}

func (g *gateResolver) callsFor(tok string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[tok]
}

// connectAsync starts a Runner-like CONNECT and returns where its outcome goes.
func connectAsync(url, tok string) <-chan error {
	out := make(chan error, 1)
	go func() {
		nc, err := connectLikeRunner(url, tok)
		if err == nil {
			nc.Close()
		}
		out <- err
	}()
	return out
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("%s: nothing within %v", what, waitFor)
	}
	var zero T
	return zero
}

// A request's age starts when the callout receives it: a slow resolve (a key
// fetch, a database lookup) does not hold up the next request delivered on
// the same connection, which is answered while the slow one still waits.
func TestSlowResolveHoldsNoOtherRequest(t *testing.T) {
	k := freshKeys(t)
	url := startEmbedded(t, k.config(t))
	w := newWorld(t, kubeissuer.Options{})
	slowTok, fastTok := w.token(t, "node-slow"), w.token(t, "node-fast")
	gate := newGate(w.resolver, slowTok)
	evs := newEvents()
	startCallout(t, url, k, func(c *callout.Config) { c.Resolver = gate; c.Observe = evs.observe }) // one connection, 4 workers

	slow := connectAsync(url, slowTok)
	wait(t, gate.entered, "the slow request's resolve")
	start := time.Now()
	nc, err := connectLikeRunner(url, fastTok)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("CONNECT behind a held request: %v", err)
	}
	nc.Close()
	if gate.heldReturned() {
		t.Fatal("the second CONNECT was answered only after the held request's resolve returned")
	}
	fast := evs.next(t)
	if fast.Outcome != callout.OutcomeAuthorized || fast.RunnerID != "prod/node-fast" {
		t.Fatalf("decision %s for %q (%s), want authorized prod/node-fast", fast.Outcome, fast.RunnerID, fast.Reason)
	}
	close(gate.release)
	if err := wait(t, slow, "the held CONNECT"); err != nil {
		t.Fatalf("held CONNECT, released: %v", err)
	}
	if d := evs.next(t); d.Outcome != callout.OutcomeAuthorized || d.RunnerID != "prod/node-slow" {
		t.Fatalf("decision %s for %q (%s), want authorized prod/node-slow", d.Outcome, d.RunnerID, d.Reason)
	}
	t.Logf("CONNECT behind a held request answered in %v (request age %v)", took.Round(time.Millisecond), fast.Age)
}

// A request that waited in the callout's queue past the horizon (every
// worker busy) is dropped when it is taken, never verified; its client gets
// the first PING instead of an answer, as it would have anyway. The queueing
// is on the callout's injected clock; the client's failure on the real one.
func TestQueuedPastHorizonIsDropped(t *testing.T) {
	k := freshKeys(t)
	url := startEmbedded(t, k.config(t))
	w := newWorld(t, kubeissuer.Options{})
	busyTok, queuedTok := w.token(t, "node-busy"), w.token(t, "node-queued")
	clk := testutil.NewClock(time.Now())
	gate := newGate(w.resolver, busyTok)
	evs := newEvents()
	r := startCallout(t, url, k, func(c *callout.Config) {
		c.Resolver, c.Observe, c.Now, c.Workers = gate, evs.observe, clk.Now, 1
	})
	// While the only worker is busy, the queued request ages past the horizon.
	gate.during = func() { clk.Advance(callout.DefaultAnswerHorizon + 200*time.Millisecond) }

	busy := connectAsync(url, busyTok)
	wait(t, gate.entered, "the busy request's resolve")
	queued := connectAsync(url, queuedTok)
	// The queued request is counted in flight once it has arrived (and its
	// arrival is stamped).
	inFlight := time.NewTicker(5 * time.Millisecond)
	defer inFlight.Stop()
	deadline := time.After(waitFor)
	for r.InFlight() < 2 {
		select {
		case <-inFlight.C:
		case <-deadline:
			t.Fatalf("the second request did not arrive within %v (%d in flight)", waitFor, r.InFlight())
		}
	}
	close(gate.release)
	if err := wait(t, busy, "the busy CONNECT"); err != nil {
		t.Fatalf("busy CONNECT: %v", err)
	}
	if d := evs.next(t); d.Outcome != callout.OutcomeAuthorized || d.RunnerID != "prod/node-busy" {
		t.Fatalf("decision %s for %q (%s), want authorized prod/node-busy", d.Outcome, d.RunnerID, d.Reason)
	}
	if d := evs.next(t); d.Outcome != callout.OutcomeDropped || d.Reason != callout.DropPastHorizon {
		t.Fatalf("queued request: %s (%s), want dropped (%s)", d.Outcome, d.Reason, callout.DropPastHorizon)
	}
	if n := gate.callsFor(queuedTok); n != 0 {
		t.Fatalf("the request dropped past its horizon was resolved %d times", n)
	}
	if err := wait(t, queued, "the queued CONNECT"); err == nil || err.Error() != firstPingErr {
		t.Fatalf("queued CONNECT: %v, want %q", err, firstPingErr)
	}
	evs.none(t)
	// The server itself waits for an answer until its authorization timeout
	// (5 s here), so its shutdown at the end of the test waits for that too.
}
