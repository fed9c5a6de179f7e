package horizon

import (
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// serverLag is how late the server reads what the callout sends in
// TestLaggingConnectionDropsBeforeVerifying: past the first PING, as a
// nats-server short of CPU in a reconnect storm reads its callout
// connections' answers.
const serverLag = 2500 * time.Millisecond

// A callout whose connection's answers the server reads 2.5 s late (past
// the client's first PING) drops a request arriving on it unverified, as past
// its horizon, instead of answering into a queue the client's CONNECT does
// not outlive: the PING it keeps in flight on the connection waits in the
// same queue, so the callout knows the lag before it verifies anything.
func TestLaggingConnectionDropsBeforeVerifying(t *testing.T) {
	onBothServers(t, func(t *testing.T, serve func(*testing.T, string) string) {
		k := freshKeys(t)
		url := serve(t, k.config(t))
		w := newWorld(t, kubeissuer.Options{})
		res := &verifiertest.CountingResolver{Inner: w.resolver}
		evs := newEvents()
		// The server reads what the callout sends late: a proxy holds it.
		proxy := testutil.StartProxy(t, url[len("nats://"):], 0)
		nc := connectCallout(t, "nats://"+proxy.Addr(), k)
		proxy.SetDelay(serverLag) // from now on
		start := time.Now()
		r := startCalloutOn(t, nc, k, func(c *callout.Config) {
			c.Resolver = res
			c.Observe = evs.observe
		})
		// Start waited for its subscription's round trip through the lag,
		// and took it for the connection's first lag.
		if took := time.Since(start); took < serverLag {
			t.Fatalf("the callout started in %v, before its subscription could cross the %v lag", took, serverLag)
		}
		if lag := r.NATSLag(); lag < serverLag {
			t.Fatalf("NATSLag %v after a %v round trip", lag, serverLag)
		}

		_, err := connectLikeRunner(url, w.token(t, "node-behind-a-lagging-callout"))
		if err == nil {
			t.Fatal("CONNECT succeeded: nothing answered it, so the server cannot have authorized it")
		}
		d := evs.next(t)
		if d.Outcome != callout.OutcomeDropped || d.Reason != callout.DropPastHorizon {
			t.Fatalf("callout decision %s (%s), want dropped (%s)", d.Outcome, d.Reason, callout.DropPastHorizon)
		}
		if n := res.Calls(); n != 0 {
			t.Fatalf("the resolver verified %d tokens for a request the callout could not answer in time", n)
		}
		t.Logf("CONNECT failed with %q; the callout dropped its request unverified", err)
		evs.none(t)
	})
}
