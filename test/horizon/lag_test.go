package horizon

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// serverLag is how late the server reads what the callout sends in
// TestLaggingConnectionDropsBeforeVerifying: past the first PING, as a
// nats-server short of CPU in a reconnect storm reads its callout
// connections' answers.
const serverLag = 2500 * time.Millisecond

// laggingProxy forwards TCP connections to target and holds every byte a
// client sends for the lag set then (none at first) before passing it on, in
// order; what the target sends back is not held. It stands for a server that
// reads one connection's messages late. It stops when the test ends.
func laggingProxy(t *testing.T, target string, lag *atomic.Int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	type chunk struct {
		b  []byte
		at time.Time
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
			held := make(chan chunk, 1024)
			wg.Go(func() {
				defer close(held)
				for {
					b := make([]byte, 32<<10)
					n, err := c.Read(b)
					if n > 0 {
						held <- chunk{b[:n], time.Now().Add(time.Duration(lag.Load()))}
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer s.Close()
				for ch := range held {
					// The lag is what the proxy is for: it emulates time the
					// bytes spend queued, so it waits on the clock.
					if d := time.Until(ch.at); d > 0 {
						time.Sleep(d)
					}
					if _, err := s.Write(ch.b); err != nil {
						return
					}
				}
			})
		}
	})
	return "nats://" + ln.Addr().String()
}

// countingResolver counts the tokens it is asked to verify.
type countingResolver struct {
	inner callout.Resolver
	calls atomic.Int64
}

func (c *countingResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	c.calls.Add(1)
	return c.inner.Resolve(ctx, tok, want)
}

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
		res := &countingResolver{inner: w.resolver}
		evs := newEvents()
		var lag atomic.Int64
		nc := connectCallout(t, laggingProxy(t, url[len("nats://"):], &lag), k)
		lag.Store(int64(serverLag)) // from now on
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
		if n := res.calls.Load(); n != 0 {
			t.Fatalf("the resolver verified %d tokens for a request the callout could not answer in time", n)
		}
		t.Logf("CONNECT failed with %q; the callout dropped its request unverified", err)
		evs.none(t)
	})
}
