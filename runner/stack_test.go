package runner

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// stack is the NATS plane on real parts: a local HTTPS issuer, the verifier,
// an in-process nats-server with an auth callout (natsembed: server-config
// mode, xkey), the callout responder, and a "server" connection in the Runners' account that
// sends commands.
type stack struct {
	issuer  *kubeissuer.Issuer
	ns      *server.Server
	url     string
	cluster string
	server  *nats.Conn // the Compass Server's connection (an auth user)
	calls   *calloutLog
}

type stackOpts struct {
	maxUserLifetime time.Duration // callout's cap (callout default when zero)
	issuerNow       func() time.Time
}

// calloutLog records the callout's decisions.
type calloutLog struct {
	mu      sync.Mutex
	evs     []callout.Event
	changed chan struct{} // closed and replaced on every add
}

func (c *calloutLog) add(ev callout.Event) {
	c.mu.Lock()
	c.evs = append(c.evs, ev)
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
	c.mu.Unlock()
}

// waitCount waits until the callout has recorded at least n decisions and
// returns how many it has. The callout records a decision just after
// publishing its answer, so a client can be connected before it is counted.
func (c *calloutLog) waitCount(t *testing.T, n int, d time.Duration) int {
	t.Helper()
	deadline := time.After(d)
	for {
		c.mu.Lock()
		got := len(c.evs)
		if got >= n {
			c.mu.Unlock()
			return got
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("callout recorded %d decisions after %v, want %d", got, d, n)
		}
	}
}

func newStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{Now: o.issuerNow})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Close() })

	calls := &calloutLog{}
	nc := natsembed.Start(t, natsembed.Config{
		Resolver: verifiertest.Resolver(t, is, "test", "bootstrap"), MaxLifetime: o.maxUserLifetime,
		Workers: 8, ServerUser: true, Observe: calls.add,
	})
	snc, err := nats.Connect(nc.URL, nats.UserInfo(natsembed.ServerUser, natsembed.ServerPassword))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(snc.Close)
	return &stack{issuer: is, ns: nc.Server, url: nc.URL, cluster: "test", server: snc, calls: calls}
}

// runnerID is the ID the verifier derives for node.
func (s *stack) runnerID(node string) string { return verifier.WorkloadRunnerID(s.cluster, node) }

// tokenFile writes a projected token for node with the given lifetime.
func (s *stack) tokenFile(t *testing.T, node string, lifetime time.Duration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if _, err := s.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, lifetime); err != nil {
		t.Fatal(err)
	}
	return path
}
