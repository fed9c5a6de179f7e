package natsembed

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// testKick: in each auth mode, the kick identity (a least-privilege system
// user: a password user in server-config mode, a user JWT of the system
// account in operator mode) ends a Runner denied by node UID (judged by the
// grant the callout remembered) and then one denied by node name, leaves the
// other Runners and compass-server's own connection alone, and may not do
// anything but list and kick.
func testKick(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	nc, err := nats.Connect(e.srv.ClientURL(), append([]nats.Option{nats.Name("compass-callout-kick")}, e.kickOpts...)...)
	if err != nil {
		t.Fatalf("kick identity connect: %v", err)
	}
	t.Cleanup(nc.Close)

	var kp atomic.Pointer[kick.Kicker]
	rp := e.startCallout(1, func(c *callout.Config) {
		observe := c.Observe
		c.Observe = func(ev callout.Event) {
			observe(ev)
			if k := kp.Load(); ev.Outcome == callout.OutcomeAuthorized && k != nil {
				k.Authorized(callout.GrantOf(ev))
			}
		}
	})
	account, issuer := rp.r.RunnerAccount()
	k, err := kick.New(kick.Config{Conn: nc, Account: account, Issuers: []string{issuer},
		Policy: callout.RevocationPolicy(e.verifier, nil, nil), Logger: slog.New(slog.NewTextHandler(e.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	kp.Store(k)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const uidA = "3c1f6a9e-0d1b-4f1e-8a3a-6a0e5b7c9d01"
	connect := func(node, uid string) chan struct{} {
		t.Helper()
		tok, err := e.issuer.Token(kubeissuer.Pod{NodeName: node, NodeUID: uid}, 0)
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		if _, _, err := e.connectRunner(tok, nats.ClosedHandler(func(*nats.Conn) { close(closed) })); err != nil {
			t.Fatalf("runner %s: %v", node, err)
		}
		if ev := e.event(); ev.Outcome != callout.OutcomeAuthorized {
			t.Fatalf("runner %s: %+v", node, ev)
		}
		return closed
	}
	a := connect("node-a", uidA)
	b := connect("node-b", "")
	c := connect("node-c", "")
	srv := e.serverConn()
	reload := func(deny *verifier.NodeDeny) {
		t.Helper()
		clusters := append([]verifier.RunnerCluster(nil), e.clusters...)
		clusters[0].Deny = deny // prod
		if err := e.verifier.Reload(clusters); err != nil {
			t.Fatal(err)
		}
		k.Sweep("test")
	}
	closedWithin := func(ch chan struct{}, who string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(waitFor):
			t.Fatalf("%s still connected after the deny", who)
		}
	}
	open := func(ch chan struct{}, who string) {
		t.Helper()
		select {
		case <-ch:
			t.Fatalf("%s was ended", who)
		default:
		}
	}

	reload(&verifier.NodeDeny{NodeUIDs: []string{uidA}})
	closedWithin(a, "node-a (denied by UID)")
	reload(&verifier.NodeDeny{NodeUIDs: []string{uidA}, Nodes: []string{"node-b"}})
	closedWithin(b, "node-b (denied by name)")
	open(c, "node-c")
	if err := srv.FlushTimeout(waitFor); err != nil {
		t.Fatalf("compass-server's connection: %v", err)
	}

	// The kick identity may list and kick, nothing else: anything else is a
	// permissions violation.
	errs := make(chan error, 4)
	weak, err := nats.Connect(e.srv.ClientURL(), append(append([]nats.Option{}, e.kickOpts...),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer weak.Close()
	for _, subj := range []string{"$SYS.REQ.SERVER.PING.STATSZ", "$SYS.REQ.ACCOUNT.PING.CONNZ", "$SYS.REQ.USER.AUTH"} {
		if err := weak.Publish(subj, nil); err != nil {
			t.Fatal(err)
		}
		_ = weak.Flush()
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("publish %s: %v, want a permissions violation", subj, err)
			}
		case <-time.After(waitFor):
			t.Fatalf("the kick identity published %s without a permissions violation", subj)
		}
	}
}
