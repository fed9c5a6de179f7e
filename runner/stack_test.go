package runner

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// stack is the NATS plane on real parts: a local HTTPS issuer, the verifier,
// an in-process nats-server with an auth callout (server-config mode), the
// callout responder, and a "server" connection in the Runners' account that
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
	// callout.Responder.Start flushes with ctx, which nats.go requires to
	// have a deadline; the deadline also ends the responder, so it is far.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	dir := t.TempDir()
	is, err := kubeissuer.New(kubeissuer.Options{Now: o.issuerNow})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Close() })
	caFile, err := is.WriteCAFileIn(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	v, err := verifier.NewRunnerVerifier([]verifier.RunnerCluster{{Name: "test", Issuer: is.URL(), CAFile: caFile}}, "bootstrap", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	signer, err := callout.NewSigner(seed, nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`
host: 127.0.0.1
port: -1
accounts {
  AUTH: { users: [ { user: callout, password: callout-pw } ] }
  RUNNERS: { users: [ { user: server, password: server-pw } ] }
}
authorization {
  auth_callout {
    issuer: %s
    account: AUTH
    auth_users: [ callout, server ]
  }
}
`, pub)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}

	calls := &calloutLog{}
	cnc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("callout", "callout-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	resp, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: verifier.NewResolver(v, nil),
		ResponseSigner: signer, Account: "RUNNERS", MaxLifetime: o.maxUserLifetime,
		Logger: slog.New(slog.DiscardHandler), Observe: calls.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Start(ctx, cnc); err != nil {
		t.Fatal(err)
	}
	snc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("server", "server-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(snc.Close)
	return &stack{issuer: is, ns: ns, url: ns.ClientURL(), cluster: "test", server: snc, calls: calls}
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
