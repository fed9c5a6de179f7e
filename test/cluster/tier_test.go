// Package cluster is the cluster test tier: NATS as three in-process
// nats-servers joined by routes, every node with the same server-config
// auth_callout block (xkey on), two callout replicas on two of the nodes, the
// Server's NATS user, and Runners (runner.Runner, projected tokens from a
// local HTTPS issuer) spread over all three. It proves what a NATS cluster
// changes for Compass: authorization requests cross routes to whichever
// replica subscribes, Runners keep their subject isolation across routes, and
// a node's loss costs its own Runners a reconnect and nothing else. Its
// supercluster (supercluster_tier_test.go) is two such clusters, regions of
// three nodes and two, joined by gateways, each with its own replicas,
// kicker and cluster file: authorizations stay in their region, commands
// and kicks cross, and a region lost or cut off leaves the other serving.
package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// clusterName is the Kubernetes cluster of the Runners' tokens.
const clusterName = "prod"

// Bounds of the tier's waits, each generous for a loaded two-core machine.
const (
	// formTimeout bounds the routes' forming and interest crossing them.
	formTimeout = 15 * time.Second
	// connectTimeout bounds a Runner's first connect or its reconnect after
	// a node loss (its backoff is a few hundred milliseconds here).
	connectTimeout = 20 * time.Second
	// requestTimeout bounds one command round trip.
	requestTimeout = 5 * time.Second
)

// node is one nats-server of the cluster, with fixed ports so that it can be
// restarted where its peers and clients expect it.
type node struct {
	name              string
	port, clusterPort int
	conf              string
	ns                *server.Server
}

func (n *node) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// replica is one callout replica: a responder on one connection to one node.
// The connection does not reconnect: the replica stands for one lost with its
// node (beside it on a host, or behind it in a zone). compass-callout itself
// reconnects to the cluster's other nodes (callout/connect.go), which only
// adds answers to what these tests prove.
type replica struct {
	name string
	node int
	nc   *nats.Conn
	r    *callout.Responder
	log  *decisions
	// stop drains the responder and closes its connection: the replica
	// is gone, its node is not.
	stop func()
}

// decisions records a replica's decisions.
type decisions struct {
	mu      sync.Mutex
	evs     []callout.Event
	changed chan struct{}
}

func newDecisions() *decisions { return &decisions{changed: make(chan struct{})} }

func (d *decisions) add(ev callout.Event) {
	d.mu.Lock()
	d.evs = append(d.evs, ev)
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

// since returns the decisions from index i on, and the count so far.
func (d *decisions) since(i int) ([]callout.Event, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.evs[min(i, len(d.evs)):]), len(d.evs)
}

// waitAuthorized waits until the decisions from index from on authorize
// every ID of ids.
func (d *decisions) waitAuthorized(t *testing.T, from int, ids []string) {
	t.Helper()
	deadline := time.After(connectTimeout)
	for {
		d.mu.Lock()
		ch := d.changed
		got := map[string]bool{}
		for _, ev := range d.evs[min(from, len(d.evs)):] {
			if ev.Outcome == callout.OutcomeAuthorized {
				got[ev.RunnerID] = true
			}
		}
		d.mu.Unlock()
		missing := 0
		for _, id := range ids {
			if !got[id] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d of %d Runners never authorized by this replica", missing, len(ids))
		}
	}
}

// events collects one Runner's link events.
type events struct {
	mu      sync.Mutex
	all     []runner.LinkEvent
	changed chan struct{}
}

func newEvents() *events { return &events{changed: make(chan struct{})} }

func (e *events) add(ev runner.LinkEvent) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
}

// snapshot counts every kind of event so far.
func (e *events) snapshot() map[runner.LinkEventKind]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := map[runner.LinkEventKind]int{}
	for _, ev := range e.all {
		m[ev.Kind]++
	}
	return m
}

func (e *events) count(kind runner.LinkEventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// times is when each event of kind happened, in order.
func (e *events) times(kind runner.LinkEventKind) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []time.Time
	for _, ev := range e.all {
		if ev.Kind == kind {
			out = append(out, ev.At)
		}
	}
	return out
}

// wait waits until at least n events of kind happened.
func (e *events) wait(t *testing.T, kind runner.LinkEventKind, n int, who string) {
	t.Helper()
	deadline := time.After(connectTimeout)
	for {
		e.mu.Lock()
		ch := e.changed
		e.mu.Unlock()
		if e.count(kind) >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: %d %s events after %s, want %d", who, e.count(kind), kind, connectTimeout, n)
		}
	}
}

// runnerHandle is one Runner of the tier, started on one node's URL alone:
// it learns the other nodes from INFO.
type runnerHandle struct {
	id       string
	kubeNode string // the Kubernetes node its token names
	node     int
	r        *runner.Runner
	evs      *events
	logs     *testlog.Buffer
}

// tier is the running cluster.
type tier struct {
	t *testing.T
	// name is the NATS cluster's name (and, in a supercluster, its
	// gateway's); cluster is the Kubernetes cluster of its Runners' tokens,
	// and kubePrefix begins their node names.
	name, cluster, kubePrefix string
	// authorized, when set, is told of every Runner a replica authorizes
	// (a kicker's Authorized).
	authorized atomic.Pointer[func(callout.Event)]
	issuer     *kubeissuer.Issuer
	resolver   callout.Resolver
	signer     *callout.Signer
	xkey       *callout.XKey
	nodes      []*node
	replicas   []*replica
	runners    []*runnerHandle
}

type tierOpts struct {
	// replicaNodes are the nodes the callout replicas connect to, one each.
	replicaNodes []int
	// runnersPerNode Runners start on each node.
	runnersPerNode int
	// farDelay, when not zero, makes node farNode far from the others:
	// everything it sends over its routes arrives farDelay late, as from a
	// node in another zone, while what they send it and the other routes are
	// as fast as loopback (see farRoutes).
	farNode  int
	farDelay time.Duration
	// kickUser adds the kick identity (natsembed.KickUser) to the system
	// account, for a kicker (package kick) beside the replicas.
	kickUser bool
	// region, when set, makes the cluster one region of a supercluster
	// (supercluster_test.go); nil: the lone three-node cluster.
	region *regionConf
}

// regionConf is what a region of a supercluster takes from it: its own
// name, size and gateway block, and the Kubernetes issuer, callout keys and
// resolver (the region's own cluster file) the supercluster made for it.
type regionConf struct {
	name    string // the NATS cluster's and gateway's name; its nodes' names begin with it
	nodes   int
	cluster string // the Kubernetes cluster of the region's Runners
	issuer  *kubeissuer.Issuer
	signer  *callout.Signer
	xkey    *callout.XKey
	// resolver is what the region's callout replicas verify tokens with.
	resolver callout.Resolver
	// gateway is node i's gateway block.
	gateway func(i int) string
}

func newTier(t *testing.T, o tierOpts) *tier {
	t.Helper()
	tr := &tier{t: t, name: "compass", cluster: clusterName}
	size, prefix, gateway := 3, "n", func(int) string { return "" }
	if r := o.region; r != nil {
		tr.name, tr.cluster, tr.kubePrefix = r.name, r.cluster, r.name+"-"
		tr.issuer, tr.signer, tr.xkey, tr.resolver = r.issuer, r.signer, r.xkey, r.resolver
		size, prefix, gateway = r.nodes, r.name, r.gateway
	} else {
		var err error
		if tr.issuer, err = kubeissuer.New(kubeissuer.Options{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.issuer.Close() })
		tr.resolver = verifiertest.Resolver(t, tr.issuer, clusterName, "")
		tr.signer, tr.xkey = natsembed.Keys(t)
	}

	ports := testutil.FreePorts(t, 2*size+1)
	for i := range size {
		tr.nodes = append(tr.nodes, &node{name: fmt.Sprintf("%s%d", prefix, i), port: ports[2*i], clusterPort: ports[2*i+1]})
	}
	routes, advertise, farVia := tr.fullMesh(), "", []int(nil)
	if o.farDelay > 0 {
		// Every node advertises a port nobody listens on: a node that
		// hears of another from a third tries the one implicit route it
		// would open, fails, and keeps its configured ones, so that no
		// route bypasses the far node's proxies, whoever starts first.
		routes, farVia = tr.farRoutes(o.farNode, o.farDelay)
		advertise = fmt.Sprintf("advertise: \"127.0.0.1:%d\"", ports[2*size])
	}
	sys, kickAuth := "SYS {}", ""
	if o.kickUser {
		sys, kickAuth = "SYS { users: [ "+natsembed.KickUserConfig+" ] }", ", "+natsembed.KickUser
	}
	for i, n := range tr.nodes {
		// The same accounts and auth_callout block on every node: a CONNECT's
		// request is published in CALLOUT on the node the client reached,
		// and crosses a route to a replica on another node.
		n.conf = fmt.Sprintf(`
server_name: %s
listen: "127.0.0.1:%d"
accounts {
  CALLOUT { users: [ { user: %s, password: %s } ] }
  %s { users: [ { user: %s, password: %s } ] }
  %s
}
system_account: SYS
authorization {
  timeout: 5
  auth_callout {
    issuer: %s
    account: CALLOUT
    auth_users: [ %s, %s%s ]
    xkey: %s
  }
}
cluster {
  name: %s
  listen: "127.0.0.1:%d"
  routes: [ %s ]
  %s
}
%s`, n.name, n.port, natsembed.CalloutUser, natsembed.CalloutPassword,
			natsembed.Account, natsembed.ServerUser, natsembed.ServerPassword, sys,
			tr.signer.Public(), natsembed.CalloutUser, natsembed.ServerUser, kickAuth, tr.xkey.Public(),
			tr.name, n.clusterPort, strings.Join(routes[i], ", "), advertise, gateway(i))
		tr.start(i)
	}
	tr.waitFormed()
	if o.farDelay > 0 {
		tr.checkFar(o.farNode, farVia)
	}
	for _, at := range o.replicaNodes {
		tr.startReplica(at)
	}
	tr.waitCalloutInterest()
	for i := range tr.nodes {
		for range o.runnersPerNode {
			tr.startRunner(i)
		}
	}
	for _, h := range tr.runners {
		h.evs.wait(t, runner.EventConnected, 1, h.id)
		tr.place(h)
	}
	for i := range tr.nodes {
		if o.runnersPerNode > 0 && len(tr.onNode(i)) == 0 {
			t.Fatalf("no Runner stayed on %s", tr.nodes[i].name)
		}
	}
	return tr
}

// fullMesh is each node's routes: one to each other node's cluster port.
func (tr *tier) fullMesh() [][]string {
	routes := make([][]string, len(tr.nodes))
	for i := range tr.nodes {
		for j, m := range tr.nodes {
			if j != i {
				routes[i] = append(routes[i], fmt.Sprintf("%q", fmt.Sprintf("nats://127.0.0.1:%d", m.clusterPort)))
			}
		}
	}
	return routes
}

// farRoutes is each node's routes when node far is far from the others,
// and the ports of the proxies far's routes go through. Only far opens its
// routes, each through a testutil.Proxy that holds what far sends for delay
// and passes the answers straight back; the others list no route to far.
// The caller makes every node advertise an unreachable route address, so
// that no node opens another route than these.
func (tr *tier) farRoutes(far int, delay time.Duration) ([][]string, []int) {
	tr.t.Helper()
	routes := make([][]string, len(tr.nodes))
	var via []int
	for j, m := range tr.nodes {
		if j == far {
			continue
		}
		p := testutil.StartProxy(tr.t, fmt.Sprintf("127.0.0.1:%d", m.clusterPort), delay)
		_, port, err := net.SplitHostPort(p.Addr())
		if err != nil {
			tr.t.Fatal(err)
		}
		n, _ := strconv.Atoi(port)
		via = append(via, n)
		routes[far] = append(routes[far], fmt.Sprintf("%q", "nats://"+p.Addr()))
		for k, o := range tr.nodes {
			if k != far && k != j {
				routes[j] = append(routes[j], fmt.Sprintf("%q", fmt.Sprintf("nats://127.0.0.1:%d", o.clusterPort)))
			}
		}
	}
	return routes, via
}

// checkFar checks that every route of node far is one far opened through
// one of its proxies (ports via): none bypasses the delay.
func (tr *tier) checkFar(far int, via []int) {
	tr.t.Helper()
	farID := tr.nodes[far].ns.ID()
	for i, n := range tr.nodes {
		rz, err := n.ns.Routez(nil)
		if err != nil {
			tr.t.Fatal(err)
		}
		for _, r := range rz.Routes {
			switch {
			case i == far && (!r.DidSolicit || !slices.Contains(via, r.Port)):
				tr.t.Fatalf("%s has a route to %s at port %d, not through its proxies %v", n.name, r.RemoteID, r.Port, via)
			case r.RemoteID == farID && r.DidSolicit:
				tr.t.Fatalf("%s opened a route to the far node %s: it bypasses the proxies", n.name, r.RemoteID)
			}
		}
	}
}

// place records the node h is connected to. A Runner starts on one node's
// URL, so it lands there, unless that first CONNECT failed (on a loaded
// machine, a slow authorization) and nats.go retried on a node it had just
// learned from INFO: then it is where it is.
func (tr *tier) place(h *runnerHandle) {
	tr.t.Helper()
	st := h.r.Link().Status()
	for i, n := range tr.nodes {
		if n.ns.ID() == st.ServerID {
			if i != h.node {
				tr.t.Logf("Runner %s started at %s landed on %s (%d slow authorizations, %d refusals)", h.id, tr.nodes[h.node].name, n.name, st.SlowAuths, st.AuthRefusals)
			}
			h.node = i
			return
		}
	}
	tr.t.Fatalf("Runner %s is on server %q, none of the tier's (%+v):\n%s", h.id, st.ServerID, st, h.logs)
}

// start (re)starts node i from its configuration, on its ports.
func (tr *tier) start(i int) {
	tr.t.Helper()
	tr.nodes[i].ns = natsembed.Serve(tr.t, tr.nodes[i].conf, nil)
}

// stop shuts node i down and waits until the others dropped their routes to
// it (and with them the interest of whatever was connected there).
func (tr *tier) stop(i int) {
	tr.t.Helper()
	gone := tr.nodes[i].ns.ID()
	tr.nodes[i].ns.Shutdown()
	tr.nodes[i].ns.WaitForShutdown()
	for j, n := range tr.nodes {
		if j == i {
			continue
		}
		testutil.Eventually(tr.t, formTimeout, n.name+" to drop its routes to "+tr.nodes[i].name, func() bool {
			return !slices.Contains(routePeers(tr.t, n.ns), gone)
		})
	}
}

// routePeers is the server IDs ns has routes to.
func routePeers(t *testing.T, ns *server.Server) []string {
	t.Helper()
	rz, err := ns.Routez(nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rz.Routes {
		if !slices.Contains(ids, r.RemoteID) {
			ids = append(ids, r.RemoteID)
		}
	}
	return ids
}

// waitFormed waits until every running node has routes to every other.
func (tr *tier) waitFormed() {
	tr.t.Helper()
	for _, n := range tr.nodes {
		testutil.Eventually(tr.t, formTimeout, n.name+" to route to every other node of "+tr.name, func() bool { return len(routePeers(tr.t, n.ns)) == len(tr.nodes)-1 })
	}
}

// waitCalloutInterest waits until every node knows of a subscriber on the
// callout subject, local or across a route.
func (tr *tier) waitCalloutInterest() {
	tr.t.Helper()
	for _, n := range tr.nodes {
		tr.waitInterest(n, "CALLOUT", callout.Subject)
	}
}

// waitInterest waits until n knows of a subscriber on subject in account.
func (tr *tier) waitInterest(n *node, account, subject string) {
	tr.t.Helper()
	acc, err := n.ns.LookupAccount(account)
	if err != nil {
		tr.t.Fatal(err)
	}
	testutil.Eventually(tr.t, formTimeout, n.name+" to know of a subscriber on "+subject, func() bool { return acc.SubscriptionInterest(subject) })
}

// startReplica runs a callout replica connected to node at.
func (tr *tier) startReplica(at int) *replica {
	tr.t.Helper()
	rep := &replica{name: fmt.Sprintf("callout-%d", len(tr.replicas)), node: at, log: newDecisions()}
	r, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: tr.resolver, ResponseSigner: tr.signer,
		Account: natsembed.Account, XKey: tr.xkey, Workers: 4,
		Logger: slog.New(slog.DiscardHandler), Observe: func(ev callout.Event) {
			rep.log.add(ev)
			if f := tr.authorized.Load(); f != nil && ev.Outcome == callout.OutcomeAuthorized {
				(*f)(ev)
			}
		},
	})
	if err != nil {
		tr.t.Fatal(err)
	}
	nc, err := nats.Connect(tr.nodes[at].url(), nats.UserInfo(natsembed.CalloutUser, natsembed.CalloutPassword),
		nats.Name("compass-callout"), nats.NoReconnect())
	if err != nil {
		tr.t.Fatal(err)
	}
	rep.stop = natsembed.StartResponder(tr.t, r, nc)
	rep.nc, rep.r = nc, r
	tr.replicas = append(tr.replicas, rep)
	return rep
}

// tokenFile writes a projected token for a Kubernetes node name.
func (tr *tier) tokenFile(kubeNode string) string {
	tr.t.Helper()
	path := filepath.Join(tr.t.TempDir(), "token")
	if _, err := tr.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: kubeNode}, 0); err != nil {
		tr.t.Fatal(err)
	}
	return path
}

// startRunner starts a Runner given node at's URL alone; it runs until the
// test ends. The caller waits for its connect.
func (tr *tier) startRunner(at int) *runnerHandle {
	tr.t.Helper()
	return tr.startRunnerWith(at, nil)
}

// startRunnerWith is startRunner with the link configuration changed by tune
// (when not nil) before the Runner starts.
func (tr *tier) startRunnerWith(at int, tune func(*runner.LinkConfig)) *runnerHandle {
	tr.t.Helper()
	kubeNode := fmt.Sprintf("%sworker-%d.example", tr.kubePrefix, len(tr.runners))
	h := &runnerHandle{id: verifier.WorkloadRunnerID(tr.cluster, kubeNode), kubeNode: kubeNode, node: at, evs: newEvents(), logs: &testlog.Buffer{}}
	log := slog.New(slog.NewTextHandler(h.logs, nil))
	path := tr.tokenFile(kubeNode)
	lc := runner.LinkConfig{
		ReconnectWait: 100 * time.Millisecond, ReconnectJitter: 100 * time.Millisecond, MaxReconnectJitter: 400 * time.Millisecond,
		OnEvent: h.evs.add,
	}
	if tune != nil {
		tune(&lc)
	}
	r, err := runner.New(runner.Config{
		RunnerID: h.id, Version: "cluster", Tokens: runner.NewFileToken(path, log, nil), TokenFile: path,
		NATSURL: tr.nodes[at].url(), Heartbeat: -1, Logger: log, Link: lc,
	})
	if err != nil {
		tr.t.Fatal(err)
	}
	h.r = r
	testutil.RunUntilCleanup(tr.t, "Runner "+h.id, runner.DrainTimeout+5*time.Second, r.Run)
	tr.runners = append(tr.runners, h)
	return h
}

// onNode is the tier's Runners that started on node i.
func (tr *tier) onNode(i int) []*runnerHandle {
	var out []*runnerHandle
	for _, h := range tr.runners {
		if h.node == i {
			out = append(out, h)
		}
	}
	return out
}

// serverConn is the Compass Server's NATS connection (an auth user of the
// Runners' account) on node at.
func (tr *tier) serverConn(at int) *nats.Conn {
	tr.t.Helper()
	nc, err := nats.Connect(tr.nodes[at].url(), nats.UserInfo(natsembed.ServerUser, natsembed.ServerPassword), nats.Name("compass-server"))
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(nc.Close)
	return nc
}
