package kick_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

const wait = 10 * time.Second

// Users of the test server besides the callout's.
const (
	serverUser, serverPassword = "server", "server-pwd" // in the Runners' account, like compass-server
	weakUser, weakPassword     = "weak", "weak-pwd"     // a system user that may list but not kick
)

// env is an in-process nats-server in server-config auth-callout mode, with
// a callout authorizing projected tokens of cluster prod.
type env struct {
	url    string
	issuer *kubeissuer.Issuer
	// nkeyUser is a user of the Runners' account with a key of its own, as
	// every non-callout user is in operator mode (a JWT user shows its key).
	nkeyUser nkeys.KeyPair
}

func start(t *testing.T) *env {
	t.Helper()
	signer, xkey := natsembed.Keys(t)
	nkeyUser, nkeyPub := natsembed.NewKey(t, nkeys.CreateUser)
	weak := fmt.Sprintf(`{ user: %q, password: %q, permissions: { publish: { allow: [ %q, %q ] }, subscribe: { allow: [ "_INBOX.>" ] } } }`,
		weakUser, weakPassword, kick.SubjectConnzAll, kick.SubjectConnzOne)
	ns := natsembed.Serve(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
accounts {
  CALLOUT { users: [ { user: %q, password: %q } ] }
  %s { users: [ { user: %q, password: %q }, { nkey: %s } ] }
  SYS { users: [ %s, %s ] }
}
system_account: SYS
authorization { auth_callout { issuer: %s, account: CALLOUT, xkey: %s, auth_users: [ %q, %q, %q, %q, %q ] } }
`, natsembed.CalloutUser, natsembed.CalloutPassword, natsembed.Account, serverUser, serverPassword, nkeyPub,
		natsembed.KickUserConfig, weak, signer.Public(), xkey.Public(),
		natsembed.CalloutUser, serverUser, natsembed.KickUser, weakUser, nkeyPub), nil)

	is := testkeys.Issuer(t)
	r, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: verifiertest.Resolver(t, is, "prod", ""),
		ResponseSigner: signer, Account: natsembed.Account, XKey: xkey, Workers: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(natsembed.CalloutUser, natsembed.CalloutPassword))
	if err != nil {
		t.Fatal(err)
	}
	natsembed.StartResponder(t, r, nc)
	return &env{url: ns.ClientURL(), issuer: is, nkeyUser: nkeyUser}
}

// runner connects a Runner of node through the callout; closed receives
// when its connection ends.
func (e *env) runner(t *testing.T, node string) (*nats.Conn, chan struct{}) {
	t.Helper()
	tok, err := e.issuer.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc, err := nats.Connect(e.url, nats.Token(tok), nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("runner %s: %v", node, err)
	}
	t.Cleanup(nc.Close)
	return nc, closed
}

// refuse is a Policy that refuses the Runner IDs in its set and counts the
// connections it was asked about.
type refuse struct {
	mu    sync.Mutex
	ids   map[string]bool
	asked map[string]int
}

func newRefuse(ids ...string) *refuse {
	p := &refuse{ids: map[string]bool{}, asked: map[string]int{}}
	for _, id := range ids {
		p.ids[id] = true
	}
	return p
}

func (p *refuse) Admitter(context.Context) (kick.Admit, error) {
	return func(c kick.Conn, _ *kick.Grant) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.asked[c.User]++
		if p.ids[c.User] {
			return kick.Refuse(kick.ReasonNodeDenied, errors.New("denied by the test"))
		}
		return nil
	}, nil
}

func (p *refuse) askedAbout(user string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked[user]
}

// run starts a Kicker as user until the test ends.
func run(t *testing.T, e *env, user, password string, p kick.Policy, mod func(*kick.Config)) (*kick.Kicker, *prometheus.Registry, *testlog.Buffer) {
	t.Helper()
	nc, err := nats.Connect(e.url, nats.UserInfo(user, password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	reg := prometheus.NewRegistry()
	logs := &testlog.Buffer{}
	cfg := kick.Config{Conn: nc, Account: natsembed.Account, Issuers: []string{natsembed.Account}, Policy: p,
		Registerer: reg, Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if mod != nil {
		mod(&cfg)
	}
	k, err := kick.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return k, reg, logs
}

// value is the metric's value with the labels (name{a="b"} form), or -1.
func value(t *testing.T, reg *prometheus.Registry, series string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			if name != series {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func closedWithin(t *testing.T, closed chan struct{}, who string) {
	t.Helper()
	select {
	case <-closed:
	case <-time.After(wait):
		t.Fatalf("%s still connected", who)
	}
}

// A sweep judges only the connections the callout granted (the issuer the
// server reports), ends the refused ones, and pages through a server's
// connections past one page.
func TestSweepEndsRefusedConnectionsAcrossPages(t *testing.T) {
	e := start(t)
	server, err := nats.Connect(e.url, nats.UserInfo(serverUser, serverPassword), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.Close)
	var keep []*nats.Conn
	for i := range 5 {
		nc, _ := e.runner(t, fmt.Sprintf("keep-%d", i))
		keep = append(keep, nc)
	}
	_, closed := e.runner(t, "bad")
	p := newRefuse("prod/bad", serverUser)
	k, reg, logs := run(t, e, natsembed.KickUser, natsembed.KickPassword, p, func(c *kick.Config) { c.PageSize = 2 })
	k.Sweep("test")
	closedWithin(t, closed, "the refused Runner")
	// The sweep saw all six Runners (three pages of two), not the Server.
	testutil.Eventually(t, wait, "the sweep's gauge", func() bool { return value(t, reg, "compass_callout_runner_connections") == 6 })
	// The server closes the connection before the kick's answer is back.
	testutil.Eventually(t, wait, "the kick counted", func() bool {
		return value(t, reg, `compass_callout_kicks_total{reason="node_denied",result="kicked"}`) == 1
	})
	for i, nc := range keep {
		if err := nc.FlushTimeout(wait); err != nil {
			t.Fatalf("Runner keep-%d: %v", i, err)
		}
		if p.askedAbout(fmt.Sprintf("prod/keep-%d", i)) == 0 {
			t.Fatalf("the policy was never asked about prod/keep-%d (paging)", i)
		}
	}
	if p.askedAbout(serverUser) != 0 || server.FlushTimeout(wait) != nil {
		t.Fatal("the Server's own connection was judged or ended")
	}
	recs, err := logs.JSONRecords("kick: runner connection ended")
	if err != nil || len(recs) != 1 || recs[0]["runner_id"] != "prod/bad" || recs[0]["reason"] != "node_denied" {
		t.Fatalf("kick log = %v, %v; want one record for prod/bad", recs, err)
	}
}

// A kick the identity may not make fails: the kicker logs it, counts it,
// raises compass_callout_kicks_failing (the documented alert) and retries
// until nothing is left to do, then lowers it.
func TestFailedKickIsRetriedAndAlerted(t *testing.T) {
	e := start(t)
	bad, closed := e.runner(t, "bad")
	_, reg, logs := run(t, e, weakUser, weakPassword, newRefuse("prod/bad"), nil)
	testutil.Eventually(t, wait, "kicks_failing raised", func() bool { return value(t, reg, "compass_callout_kicks_failing") == 1 })
	testutil.Eventually(t, wait, "the failed kick retried", func() bool {
		return value(t, reg, `compass_callout_kicks_total{reason="node_denied",result="failed"}`) >= 2
	})
	if recs, err := logs.JSONRecords("kick: could not end runner connection; retrying"); err != nil || len(recs) == 0 || recs[0]["level"] != "ERROR" {
		t.Fatalf("failed-kick log = %v, %v; want ERROR records", recs, err)
	}
	// The Runner goes by itself: the next retry finds nothing to do.
	bad.Close()
	<-closed
	testutil.Eventually(t, wait, "kicks_failing lowered", func() bool { return value(t, reg, "compass_callout_kicks_failing") == 0 })
}

// New refuses a config that cannot work.
func TestNewRefuses(t *testing.T) {
	nc := &nats.Conn{}
	ok := func() kick.Config {
		return kick.Config{Conn: nc, Account: "A", Issuers: []string{"A"}, Policy: newRefuse()}
	}
	for _, tc := range []struct {
		name string
		mod  func(*kick.Config)
		want string
	}{
		{"no connection", func(c *kick.Config) { c.Conn = nil }, "kick: no NATS connection"},
		{"no account", func(c *kick.Config) { c.Account = "" }, "kick: no Runners' account"},
		{"no issuer", func(c *kick.Config) { c.Issuers = nil }, "kick: no issuer of the callout's users"},
		{"no policy", func(c *kick.Config) { c.Policy = nil }, "kick: no policy"},
		{"grace below the floor", func(c *kick.Config) { c.DuplicateGrace = time.Second - 1 }, "kick: duplicate grace 999.999999ms is under the minimum 1s"},
		{"negative page size", func(c *kick.Config) { c.PageSize = -1 }, "kick: page size -1 is negative"},
		{"negative sweep interval", func(c *kick.Config) { c.SweepInterval = -1 }, "kick: sweep interval -1ns is negative"},
		{"negative listing interval", func(c *kick.Config) { c.ListInterval = -1 }, "kick: listing interval -1ns is negative"},
		{"unknown duplicates policy", func(c *kick.Config) { c.Duplicates = 9 }, "kick: unknown duplicates policy 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.mod(&c)
			if _, err := kick.New(c); err == nil || err.Error() != tc.want {
				t.Fatalf("New = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := kick.New(ok()); err != nil {
		t.Fatalf("New(valid) = %v", err)
	}
}

// partial is a Policy that could read only part of what it judges by: it
// refuses as its inner policy does, and reports an error with it.
type partial struct{ *refuse }

func (p partial) Admitter(ctx context.Context) (kick.Admit, error) {
	admit, _ := p.refuse.Admitter(ctx)
	return admit, errors.New("store unreachable")
}

// A policy that judged only part of the connections still has its refusals
// ended, and the sweep counts as failed: kicks_failing is raised and the
// sweep retried.
func TestPartialPolicyStillKicksAndRetries(t *testing.T) {
	e := start(t)
	_, closed := e.runner(t, "bad")
	_, reg, _ := run(t, e, natsembed.KickUser, natsembed.KickPassword, partial{newRefuse("prod/bad")}, nil)
	closedWithin(t, closed, "the refused Runner")
	testutil.Eventually(t, wait, "kicks_failing raised", func() bool { return value(t, reg, "compass_callout_kicks_failing") == 1 })
	testutil.Eventually(t, wait, "the sweep retried", func() bool { return value(t, reg, `compass_callout_kick_sweeps_total{result="failed"}`) >= 2 })
}

// grantFor is the grant the callout would record for nc as runnerID.
func grantFor(t *testing.T, nc *nats.Conn, runnerID string) kick.Grant {
	t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	return kick.Grant{RunnerID: runnerID, ServerID: nc.ConnectedServerId(), CID: cid, Addr: nc.ConnectedAddr(),
		Expiry: time.Now().Add(time.Hour)}
}

// displacements records what the Kicker reports (kick.DisplacementRecorder).
type displacements struct {
	mu sync.Mutex
	ds []kick.Displacement
}

func (r *displacements) Displaced(_ context.Context, d kick.Displacement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds = append(r.ds, d)
}

func (r *displacements) list() []kick.Displacement {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ds)
}

// hostPort fails t unless addr is a host:port with both parts.
func hostPort(t *testing.T, what, addr string) {
	t.Helper()
	if h, p, err := net.SplitHostPort(addr); err != nil || h == "" || p == "" {
		t.Fatalf("%s = %q: want host:port", what, addr)
	}
}

// When Runner IDs authenticate while they have live connections, the older
// connections are ended after the grace and only those: one at a time
// (a filtered listing each) and more than dupBatch at once (one listing of
// the account); a newer connection already gone decides nothing.
func TestDuplicatesEndTheOlderConnections(t *testing.T) {
	for _, n := range []int{1, 12} {
		t.Run(fmt.Sprintf("%d Runner IDs", n), func(t *testing.T) {
			e := start(t)
			rec := &displacements{}
			k, reg, logs := run(t, e, natsembed.KickUser, natsembed.KickPassword, newRefuse(), func(c *kick.Config) {
				c.DuplicateGrace = kick.MinDuplicateGrace
				c.Displaced = rec
			})
			var older []chan struct{}
			var newer []*nats.Conn
			for i := range n {
				node := fmt.Sprintf("n%d", i)
				_, closed := e.runner(t, node)
				older = append(older, closed)
				nc, _ := e.runner(t, node)
				newer = append(newer, nc)
			}
			// A third Runner ID whose newer connection is gone by the check.
			_, lone := e.runner(t, "lone")
			gone, _ := e.runner(t, "lone")
			goneGrant := grantFor(t, gone, "prod/lone")
			gone.Close()
			k.Authorized(goneGrant)
			for i, nc := range newer {
				k.Authorized(grantFor(t, nc, fmt.Sprintf("prod/n%d", i)))
			}
			for i, closed := range older {
				closedWithin(t, closed, fmt.Sprintf("the older connection of prod/n%d", i))
			}
			testutil.Eventually(t, wait, "the duplicates counted", func() bool {
				return value(t, reg, `compass_callout_duplicate_connections_total{action="kicked"}`) == float64(n)
			})
			for i, nc := range newer {
				if err := nc.FlushTimeout(wait); err != nil {
					t.Fatalf("the newer connection of prod/n%d: %v", i, err)
				}
			}
			select {
			case <-lone:
				t.Fatal("prod/lone's only connection was ended: its newer one had gone, so nothing should be decided")
			default:
			}
			recs, err := logs.JSONRecords("kick: runner ID has more than one live connection (a reconnect race or a copied token)")
			if err != nil || len(recs) != n {
				t.Fatalf("duplicate log records = %d, %v; want %d", len(recs), err, n)
			}
			// Both clients are named host:port, in the log and in what is
			// reported for the quarantine count.
			newerOf := map[string]string{}
			for _, r := range recs {
				c, _ := r["client"].(string)
				hostPort(t, "the WARN line's client", c)
				olders, _ := r["older_clients"].([]any)
				if len(olders) != 1 {
					t.Fatalf("older_clients = %v; want one", r["older_clients"])
				}
				o, _ := olders[0].(string)
				hostPort(t, "the WARN line's older client", o)
				newerOf[r["runner_id"].(string)] = c + " " + o
			}
			// Reported once each kick has returned.
			testutil.Eventually(t, wait, "the displacements reported", func() bool { return len(rec.list()) == n })
			for _, d := range rec.list() {
				if got := d.Newer + " " + d.Older; newerOf[d.RunnerID] != got || d.At.IsZero() {
					t.Fatalf("displacement %+v; want the clients the WARN line names, %q", d, newerOf[d.RunnerID])
				}
			}
		})
	}
}

// With DuplicatesKeep both connections stay; the duplicate is counted as kept.
func TestDuplicatesKept(t *testing.T) {
	e := start(t)
	rec := &displacements{}
	k, reg, _ := run(t, e, natsembed.KickUser, natsembed.KickPassword, newRefuse(), func(c *kick.Config) {
		c.DuplicateGrace, c.Duplicates = kick.MinDuplicateGrace, kick.DuplicatesKeep
		c.Displaced = rec
	})
	first, _ := e.runner(t, "a")
	second, _ := e.runner(t, "a")
	k.Authorized(grantFor(t, second, "prod/a"))
	testutil.Eventually(t, wait, "the duplicate counted as kept", func() bool {
		return value(t, reg, `compass_callout_duplicate_connections_total{action="kept"}`) == 1
	})
	for _, nc := range []*nats.Conn{first, second} {
		if err := nc.FlushTimeout(wait); err != nil {
			t.Fatalf("a kept connection: %v", err)
		}
	}
	if ds := rec.list(); len(ds) != 0 {
		t.Fatalf("keep reported displacements %+v; want none (detection only)", ds)
	}
}

// Duplicates is a flag.Value: kick-older and keep round-trip, anything else
// is refused.
func TestDuplicatesFlagValue(t *testing.T) {
	for _, s := range []string{"kick-older", "keep"} {
		var d kick.Duplicates
		if err := d.Set(s); err != nil || d.String() != s {
			t.Fatalf("Set(%q) = %v, String() = %q", s, err, d.String())
		}
	}
	var d kick.Duplicates
	if err := d.Set("both"); err == nil || err.Error() != "want kick-older or keep" {
		t.Fatalf("Set(both) = %v", err)
	}
	if kick.DuplicatesKickOlder.String() != "kick-older" {
		t.Fatal("the zero value is not kick-older")
	}
}

// granted is a Policy that refuses the connections whose grant (the
// callout's record of authorizing them) names a revoked token, and no
// connection without a grant.
type granted struct{ revoked string }

func (p granted) Admitter(context.Context) (kick.Admit, error) {
	return func(_ kick.Conn, g *kick.Grant) error {
		if g != nil && g.TokenID == p.revoked {
			return kick.Refuse(kick.ReasonTokenRevoked, errors.New("revoked by the test"))
		}
		return nil
	}, nil
}

// A sweep hands the Policy the grant this process recorded for a connection
// (what the Runner ID alone does not say: the node UID, the minted token),
// and only for the connection it was recorded for.
func TestSweepJudgesByTheGrant(t *testing.T) {
	e := start(t)
	k, _, _ := run(t, e, natsembed.KickUser, natsembed.KickPassword, granted{revoked: "tok-1"}, nil)
	revoked, closed := e.runner(t, "a")
	g := grantFor(t, revoked, "prod/a")
	g.TokenID = "tok-1"
	k.Authorized(g)
	other, otherClosed := e.runner(t, "b")
	og := grantFor(t, other, "prod/other") // recorded under another Runner ID: not this connection's
	og.TokenID = "tok-1"
	k.Authorized(og)
	k.Sweep("test")
	closedWithin(t, closed, "the connection whose grant names the revoked token")
	if err := other.FlushTimeout(wait); err != nil {
		t.Fatalf("a connection judged by a grant recorded for another Runner ID: %v", err)
	}
	select {
	case <-otherClosed:
		t.Fatal("a connection was ended by a grant recorded for another Runner ID")
	default:
	}
}

// A duplicate whose kick fails is checked again (a few times), each failure
// counted.
func TestFailedDuplicateKickIsRetried(t *testing.T) {
	e := start(t)
	k, reg, _ := run(t, e, weakUser, weakPassword, newRefuse(), func(c *kick.Config) { c.DuplicateGrace = kick.MinDuplicateGrace })
	e.runner(t, "a")
	second, _ := e.runner(t, "a")
	k.Authorized(grantFor(t, second, "prod/a"))
	testutil.Eventually(t, wait, "the duplicate's kick tried again", func() bool {
		return value(t, reg, `compass_callout_kicks_total{reason="duplicate",result="failed"}`) >= 2
	})
}

// The older connection of a duplicate stays open for the whole grace (a
// Runner's handover has both connections up for a moment) and is ended once
// it is over: never before. A lower bound on the real clock, which load can
// only lengthen.
func TestDuplicateOlderConnectionOutlivesTheGrace(t *testing.T) {
	const grace = 2 * time.Second
	e := start(t)
	k, _, _ := run(t, e, natsembed.KickUser, natsembed.KickPassword, newRefuse(), func(c *kick.Config) { c.DuplicateGrace = grace })
	_, older := e.runner(t, "a")
	newer, _ := e.runner(t, "a")
	g := grantFor(t, newer, "prod/a")
	at := time.Now()
	k.Authorized(g)
	closedWithin(t, older, "the older connection of prod/a")
	if took := time.Since(at); took < grace {
		t.Fatalf("the older connection was ended %s after the newer one was authorized, inside the %s grace", took, grace)
	}
}

// A connection whose user has a key of its own (an nkey user here; in
// operator mode every user but the callout's: compass-server's JWT user,
// even one signed by the signing key the callout signs Runners with) is
// never judged, whatever its issuer: the callout names its users by Runner
// ID, which is never a user key, and nats-server shows any other user's key.
func TestSweepNeverJudgesAUserWithAKeyOfItsOwn(t *testing.T) {
	e := start(t)
	pub, err := e.nkeyUser.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	own, err := nats.Connect(e.url, nats.Nkey(pub, e.nkeyUser.Sign), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	_, closed := e.runner(t, "bad")
	p := newRefuse("prod/bad", pub)
	k, reg, _ := run(t, e, natsembed.KickUser, natsembed.KickPassword, p, nil)
	k.Sweep("test")
	closedWithin(t, closed, "the refused Runner")
	testutil.Eventually(t, wait, "the sweep's gauge", func() bool { return value(t, reg, "compass_callout_runner_connections") == 1 })
	if p.askedAbout(pub) != 0 || own.FlushTimeout(wait) != nil {
		t.Fatal("the connection of a user with its own key was judged or ended")
	}
}

// Each page of a listing reaches the kicker once: the first pages, asked of
// every server at once, come to an inbox of their own, not one under the
// connection's shared reply wildcard, which the further pages' requests
// create (a reply under it would come twice: to the wildcard and to the
// inbox).
func TestListingPagesArriveOnce(t *testing.T) {
	e := start(t)
	for i := range 6 {
		e.runner(t, fmt.Sprintf("keep-%d", i))
	}
	var conn *nats.Conn
	k, reg, _ := run(t, e, natsembed.KickUser, natsembed.KickPassword, newRefuse(), func(c *kick.Config) {
		c.PageSize = 2
		c.ListInterval = time.Nanosecond // every sweep lists
		conn = c.Conn
	})
	sweeps := func() float64 { return value(t, reg, `compass_callout_kick_sweeps_total{result="ok"}`) }
	// The start sweep, whose further pages are requests, makes the reply
	// wildcard; then nothing else is pending, and the next sweep is counted.
	testutil.Eventually(t, wait, "the start sweep done", func() bool { return sweeps() == 1 })
	in := conn.Stats().InMsgs
	k.Sweep("test")
	testutil.Eventually(t, wait, "the counted sweep done", func() bool { return sweeps() == 2 })
	// One server, six Runners in pages of two: one first page, two more.
	if got := conn.Stats().InMsgs - in; got != 3 {
		t.Fatalf("a listing of three pages brought %d messages to the kicker, want 3", got)
	}
}

// podGonePolicy refuses, once on, a connection whose grant names pod
// "gone", and one without a grant whose Runner ID is prod/c: what only a
// listing finds.
type podGonePolicy struct {
	mu sync.Mutex
	on bool
}

func (p *podGonePolicy) set(on bool) { p.mu.Lock(); p.on = on; p.mu.Unlock() }

func (p *podGonePolicy) Admitter(context.Context) (kick.Admit, error) {
	p.mu.Lock()
	on := p.on
	p.mu.Unlock()
	return func(c kick.Conn, g *kick.Grant) error {
		switch {
		case !on:
			return nil
		case g != nil && g.PodUID == "gone":
			return kick.Refuse(kick.ReasonPodDeleted, errors.New("the pod is gone"))
		case g == nil && c.User == "prod/c":
			return kick.Refuse(kick.ReasonNodeDenied, errors.New("denied by the test"))
		}
		return nil
	}, nil
}

// A sweep of the grants (a pod gone) judges this process's grants alone and
// ends the refused connections by their IDs: no listing is asked for (the
// only message the kicker receives is the kick's answer), a connection this
// process did not authorize is not judged, and one whose grant is admitted
// stays.
func TestSweepGrantsListsNothing(t *testing.T) {
	// The kick identity without the events, whose messages would be
	// counted with the answers.
	e := startWithoutEvents(t)
	p := &podGonePolicy{}
	var conn *nats.Conn
	k, reg, _ := run(t, e, noEventsUser, noEventsPassword, p, func(c *kick.Config) { conn = c.Conn })
	sweeps := func() float64 { return value(t, reg, `compass_callout_kick_sweeps_total{result="ok"}`) }
	testutil.Eventually(t, wait, "the start sweep done", func() bool { return sweeps() == 1 })
	gone, goneClosed := e.runner(t, "a")
	g := grantFor(t, gone, "prod/a")
	g.PodUID = "gone"
	k.Authorized(g)
	live, liveClosed := e.runner(t, "b")
	lg := grantFor(t, live, "prod/b")
	lg.PodUID = "live"
	k.Authorized(lg)
	other, otherClosed := e.runner(t, "c") // authorized elsewhere: no grant here
	// The duplicate checks Authorized schedules fall due after the grace,
	// past this test's end.
	p.set(true)
	in := conn.Stats().InMsgs
	k.SweepGrants("pod_deleted")
	closedWithin(t, goneClosed, "the connection whose grant names the pod gone")
	testutil.Eventually(t, wait, "the grants sweep done", func() bool { return sweeps() == 2 })
	if got := conn.Stats().InMsgs - in; got != 1 {
		t.Errorf("a sweep of the grants brought %d messages to the kicker, want 1 (the kick's answer; no listing)", got)
	}
	if got := value(t, reg, `compass_callout_kicks_total{reason="pod_deleted",result="kicked"}`); got != 1 {
		t.Errorf("pod_deleted kicks = %v, want 1", got)
	}
	for _, c := range []struct {
		nc     *nats.Conn
		closed chan struct{}
		who    string
	}{{live, liveClosed, "a connection whose grant is admitted"}, {other, otherClosed, "a connection without a grant here"}} {
		if err := c.nc.FlushTimeout(wait); err != nil {
			t.Errorf("%s: %v", c.who, err)
		}
		select {
		case <-c.closed:
			t.Errorf("%s was ended by a sweep of the grants", c.who)
		default:
		}
	}
}

// noEventsUser is the kick identity of KickUserConfig without the events'
// subscribe permission, as a deployment made before the kicker followed
// them has it.
const noEventsUser, noEventsPassword = "kick-noevents", "kick-noevents-pwd"

// startWithoutEvents is start with one more system user, noEventsUser.
func startWithoutEvents(t *testing.T) *env {
	t.Helper()
	signer, xkey := natsembed.Keys(t)
	noEvents := fmt.Sprintf(`{ user: %q, password: %q, permissions: { publish: { allow: [ %q, %q, %q ] }, subscribe: { allow: [ "_INBOX.>" ] } } }`,
		noEventsUser, noEventsPassword, kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick)
	ns := natsembed.Serve(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
accounts {
  CALLOUT { users: [ { user: %q, password: %q } ] }
  %s { users: [ ] }
  SYS { users: [ %s, %s ] }
}
system_account: SYS
authorization { auth_callout { issuer: %s, account: CALLOUT, xkey: %s, auth_users: [ %q, %q, %q ] } }
`, natsembed.CalloutUser, natsembed.CalloutPassword, natsembed.Account,
		natsembed.KickUserConfig, noEvents, signer.Public(), xkey.Public(),
		natsembed.CalloutUser, natsembed.KickUser, noEventsUser), nil)
	is := testkeys.Issuer(t)
	r, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: verifiertest.Resolver(t, is, "prod", ""),
		ResponseSigner: signer, Account: natsembed.Account, XKey: xkey, Workers: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(natsembed.CalloutUser, natsembed.CalloutPassword))
	if err != nil {
		t.Fatal(err)
	}
	natsembed.StartResponder(t, r, nc)
	return &env{url: ns.ClientURL(), issuer: is}
}

// A duplicate check that the account's connect and disconnect events settle
// (the new connection seen, no older one of its Runner ID) asks no server;
// one they do not (an older connection live) lists that Runner ID and ends
// the older one, as without the events; a Runner's handover (the older
// closed within the grace) is settled by the events too. Without the
// events' permission every check lists, and the same duplicate is ended.
func TestDuplicateChecksSettledByTheAccountsEvents(t *testing.T) {
	const grace = kick.MinDuplicateGrace
	for _, tc := range []struct {
		name           string
		user, password string
		settledByEvent float64 // of the three checks: the new Runner's and the handover's
	}{
		{"with the events", natsembed.KickUser, natsembed.KickPassword, 2},
		{"without their permission", noEventsUser, noEventsPassword, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startWithoutEvents(t)
			k, reg, logs := run(t, e, tc.user, tc.password, newRefuse(), func(c *kick.Config) { c.DuplicateGrace = grace })
			sweeps := func() float64 { return value(t, reg, `compass_callout_kick_sweeps_total{result="ok"}`) }
			testutil.Eventually(t, wait, "the start sweep done", func() bool { return sweeps() == 1 })
			byEvents := func() float64 { return value(t, reg, `compass_callout_duplicate_checks_total{by="events"}`) }
			byListing := func() float64 { return value(t, reg, `compass_callout_duplicate_checks_total{by="listing"}`) }

			// A Runner that connects once.
			fresh, freshClosed := e.runner(t, "fresh")
			k.Authorized(grantFor(t, fresh, "prod/fresh"))
			// A Runner's handover: the new connection, the old one closed
			// well within the grace.
			old, _ := e.runner(t, "moving")
			moved, movedClosed := e.runner(t, "moving")
			k.Authorized(grantFor(t, moved, "prod/moving"))
			old.Close()
			testutil.Eventually(t, wait, "both checks done", func() bool { return byEvents()+byListing() == 2 })
			if got := byEvents(); got != tc.settledByEvent {
				t.Errorf("checks settled by the events = %v, want %v (by listing %v)", got, tc.settledByEvent, byListing())
			}
			// A copy: the older connection stays live.
			orig, origClosed := e.runner(t, "copied")
			cp, _ := e.runner(t, "copied")
			k.Authorized(grantFor(t, cp, "prod/copied"))
			closedWithin(t, origClosed, "the older connection of a copied token")
			if got := byListing(); got != 2-tc.settledByEvent+1 {
				t.Errorf("checks that listed = %v, want %v", got, 2-tc.settledByEvent+1)
			}
			if got := value(t, reg, `compass_callout_duplicate_connections_total{action="kicked"}`); got != 1 {
				t.Errorf("duplicates kicked = %v, want 1", got)
			}
			for _, c := range []struct {
				nc     *nats.Conn
				closed chan struct{}
				who    string
			}{{fresh, freshClosed, "a Runner connected once"}, {moved, movedClosed, "a Runner that handed over"}} {
				if err := c.nc.FlushTimeout(wait); err != nil {
					t.Errorf("%s: %v", c.who, err)
				}
				select {
				case <-c.closed:
					t.Errorf("%s was ended", c.who)
				default:
				}
			}
			_ = orig
			warned, err := logs.JSONRecords("kick: not following the Runners' account's connect and disconnect events; each duplicate check lists the servers' connections instead (grant the kick identity subscribe on them: docs/self-host.md, \"The kick identity\")")
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.settledByEvent == 0; (len(warned) == 1) != want {
				t.Errorf("the WARN about the events: %d lines, want it %v", len(warned), want)
			}
		})
	}
}

func (p *refuse) add(ids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		p.ids[id] = true
	}
}

// A sweep for a change (a node denied: "cluster_file") judges the account's
// connect and disconnect events' index while it is whole and lists nothing;
// a connection that reaches the index only after the change (authorized
// under the old policy, its event late) is judged by the settle sweep that
// follows every change; once ListInterval has passed since the last
// listing, a sweep lists again. Without the events' permission every sweep
// lists, and the same connections are ended.
func TestSweepsJudgeTheEventsIndex(t *testing.T) {
	for _, tc := range []struct {
		name           string
		user, password string
		events         bool
	}{
		{"with the events", natsembed.KickUser, natsembed.KickPassword, true},
		{"without their permission", noEventsUser, noEventsPassword, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startWithoutEvents(t)
			// Connected before the kicker starts: its first listing shows them.
			_, deniedClosed := e.runner(t, "denied")
			kept, keptClosed := e.runner(t, "kept")
			var clock atomic.Int64
			clock.Store(time.Now().UnixNano())
			now := func() time.Time { return time.Unix(0, clock.Load()) }
			p := newRefuse()
			k, reg, _ := run(t, e, tc.user, tc.password, p, func(c *kick.Config) { c.Now = now })
			listings := func() float64 { return value(t, reg, "compass_callout_kick_listings_total") }
			sweeps := func() float64 { return value(t, reg, `compass_callout_kick_sweeps_total{result="ok"}`) }
			testutil.Eventually(t, wait, "the start sweep done", func() bool { return sweeps() == 1 })
			if got := listings(); got != 1 {
				t.Fatalf("the start sweep: %v listings, want 1", got)
			}
			want := func(l float64) float64 {
				if tc.events {
					return 1
				}
				return l
			}

			p.add("prod/denied", "prod/late")
			k.Sweep("cluster_file")
			closedWithin(t, deniedClosed, "the denied node's connection")
			testutil.Eventually(t, wait, "the change's sweep done", func() bool { return sweeps() == 2 })
			if got := listings(); got != want(2) {
				t.Errorf("after the change's sweep: %v listings, want %v", got, want(2))
			}

			// Authorized before the change, seen after it: the settle sweep
			// grantSettle after the change ends it.
			_, lateClosed := e.runner(t, "late")
			closedWithin(t, lateClosed, "a connection that reached the index after the change")
			testutil.Eventually(t, wait, "the settle sweep done", func() bool { return sweeps() == 3 })
			if got := listings(); got != want(3) {
				t.Errorf("after the settle sweep: %v listings, want %v", got, want(3))
			}

			// ListInterval later, a sweep lists again.
			clock.Add(int64(kick.DefaultListInterval))
			k.Sweep("cluster_file")
			testutil.Eventually(t, wait, "the sweep after ListInterval done", func() bool { return sweeps() == 4 })
			if got, want := listings(), map[bool]float64{true: 2, false: 4}[tc.events]; got != want {
				t.Errorf("after ListInterval: %v listings, want %v", got, want)
			}
			if err := kept.FlushTimeout(wait); err != nil {
				t.Errorf("the admitted connection: %v", err)
			}
			select {
			case <-keptClosed:
				t.Error("the admitted connection was ended")
			default:
			}
			if got := value(t, reg, `compass_callout_kicks_total{reason="node_denied",result="kicked"}`); got != 2 {
				t.Errorf("node_denied kicks = %v, want 2", got)
			}
		})
	}
}
