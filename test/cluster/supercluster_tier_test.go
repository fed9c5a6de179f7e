package cluster

// The supercluster tier: two regions, each a NATS cluster of the tier's kind
// (routes, the same accounts and auth_callout block on every node, callout
// replicas connected to its own nodes), joined by gateways. Each region is a
// separate deployment: its replicas read its own copy of the cluster file
// and run its own kicker. Both files list both regions' Kubernetes clusters;
// the callout keys are the same everywhere, as the auth_callout block is.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
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
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/clusterfile"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// The regions: A of three nodes, B of two, as the issue sizes them.
var regionSpecs = []struct {
	name  string
	nodes int
}{{"a", 3}, {"b", 2}}

// region is one region of the supercluster: its NATS cluster (the tier),
// its own cluster file, and its kicker.
type region struct {
	*tier
	// entries are the region's cluster-file entries, one per region's
	// Kubernetes cluster, in regionSpecs order, without a deny list.
	entries []string
	dir     string // the region's own copy of the cluster file, and its CA files
	file    string
	reg     *clusterfile.Registry
	kicker  atomic.Pointer[kick.Kicker]
	kickLog *testlog.Buffer // the kicker's JSON log, at debug
}

// supercluster is the two regions.
type supercluster struct {
	t       *testing.T
	regions []*region
	a, b    *region
	// proxies carry every gateway connection, when partitionable.
	proxies []*testutil.Proxy
}

type superOpts struct {
	// replicas are the nodes of each region's callout replicas (A's, B's).
	replicas [2][]int
	// runnersPerNode Runners start on each node of both regions.
	runnersPerNode int
	// kick runs a kicker in each region, on its first node, sweeping
	// every sweep[i] (0: kick.DefaultSweepInterval).
	kick  bool
	sweep [2]time.Duration
	// partitionable runs every gateway connection through a proxy that
	// partition closes (see gatewayVia).
	partitionable bool
}

// kubeCluster is the Kubernetes cluster of region name's Runners.
func kubeCluster(name string) string { return "prod-" + name }

func newSupercluster(t *testing.T, o superOpts) *supercluster {
	t.Helper()
	sc := &supercluster{t: t}
	var issuers []*kubeissuer.Issuer
	for range regionSpecs {
		issuers = append(issuers, verifiertest.Issuer(t, kubeissuer.Options{}))
	}
	signer, xkey := natsembed.Keys(t)
	// Every node's gateway port, known before any region starts, and the
	// addresses the other region dials it at.
	var gwPorts [][]int
	var gwAddrs [][]string
	for _, sp := range regionSpecs {
		ports := testutil.FreePorts(t, sp.nodes)
		gwPorts = append(gwPorts, ports)
		var addrs []string
		for _, p := range ports {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
		}
		gwAddrs = append(gwAddrs, addrs)
	}
	advertise := ""
	if o.partitionable {
		gwAddrs, advertise = sc.gatewayVia(gwAddrs)
	}
	for i, sp := range regionSpecs {
		rg := &region{dir: t.TempDir(), kickLog: &testlog.Buffer{}}
		for j, other := range regionSpecs {
			rg.entries = append(rg.entries, verifiertest.ClusterEntry(t, issuers[j], rg.dir, kubeCluster(other.name)))
		}
		rg.file = verifiertest.ClusterFile(t, rg.dir, rg.entries...)
		// As compass-callout reads it: a reload applied (SIGHUP, or the
		// poll seeing it changed) asks the region's kicker for a sweep.
		reg, err := clusterfile.Open(t.Context(), clusterfile.Config{Path: rg.file, OnApply: func() {
			if k := rg.kicker.Load(); k != nil {
				k.Sweep("cluster_file")
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Verifier().Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		rg.reg = reg
		var remotes []string
		for j, other := range regionSpecs {
			if j == i {
				continue
			}
			var urls []string
			for _, a := range gwAddrs[j] {
				urls = append(urls, fmt.Sprintf("%q", "nats://"+a))
			}
			remotes = append(remotes, fmt.Sprintf("{ name: %s, urls: [ %s ] }", other.name, strings.Join(urls, ", ")))
		}
		gateway := func(n int) string {
			return fmt.Sprintf(`gateway {
  name: %s
  listen: "127.0.0.1:%d"
  gateways: [ %s ]
  %s
}
`, sp.name, gwPorts[i][n], strings.Join(remotes, ", "), advertise)
		}
		rg.tier = newTier(t, tierOpts{replicaNodes: o.replicas[i], kickUser: o.kick, region: &regionConf{
			name: sp.name, nodes: sp.nodes, cluster: kubeCluster(sp.name), issuer: issuers[i], signer: signer, xkey: xkey,
			resolver: verifier.NewResolver(reg.Verifier(), nil), gateway: gateway,
		}})
		sc.regions = append(sc.regions, rg)
	}
	sc.a, sc.b = sc.regions[0], sc.regions[1]
	sc.waitGateways()
	if o.partitionable {
		sc.checkVia()
	}
	if o.kick {
		for i, rg := range sc.regions {
			rg.startKicker(o.sweep[i], sc.servers())
		}
	}
	for _, rg := range sc.regions {
		for i := range rg.nodes {
			for range o.runnersPerNode {
				rg.startRunner(i)
			}
		}
	}
	for _, rg := range sc.regions {
		for _, h := range rg.runners {
			h.evs.wait(t, runner.EventConnected, 1, h.id)
			rg.place(h)
		}
	}
	return sc
}

// gatewayVia starts a proxy in front of every node's gateway listener
// (addrs, by region) and returns the proxies' addresses, for the other
// region to dial, and an advertise line for every node's gateway block: a
// port nobody listens on. A server learns the other region's gateway
// addresses from the INFO of the gateway connection it opened and would
// dial them directly when its connection drops; advertised unreachable,
// they fail, and only the proxies' addresses, which partition closes,
// connect.
func (sc *supercluster) gatewayVia(addrs [][]string) ([][]string, string) {
	sc.t.Helper()
	var via [][]string
	for _, region := range addrs {
		var vs []string
		for _, a := range region {
			p := testutil.StartProxy(sc.t, a, 0)
			sc.proxies = append(sc.proxies, p)
			vs = append(vs, p.Addr())
		}
		via = append(via, vs)
	}
	return via, fmt.Sprintf("advertise: \"127.0.0.1:%d\"", testutil.FreePort(sc.t))
}

// partition cuts every gateway connection, for good: the proxies close,
// and no node reaches the other region again. It waits until no node has
// a gateway connection left.
func (sc *supercluster) partition() {
	sc.t.Helper()
	if len(sc.proxies) == 0 {
		sc.t.Fatal("partition of a supercluster whose gateways are not through proxies")
	}
	for _, p := range sc.proxies {
		p.Close()
	}
	for _, rg := range sc.regions {
		for _, other := range sc.regions {
			if other == rg {
				continue
			}
			for _, n := range rg.nodes {
				testutil.Eventually(sc.t, formTimeout, n.name+" to lose its gateway connections to region "+other.name, func() bool {
					out, in := gatewayTo(sc.t, n.ns, other.name)
					return !out && in == 0
				})
			}
		}
	}
}

// checkVia checks that every node's gateway connection goes through one
// of the proxies: none bypasses what partition closes.
func (sc *supercluster) checkVia() {
	sc.t.Helper()
	var via []int
	for _, p := range sc.proxies {
		_, port, err := net.SplitHostPort(p.Addr())
		if err != nil {
			sc.t.Fatal(err)
		}
		n, _ := strconv.Atoi(port)
		via = append(via, n)
	}
	for _, rg := range sc.regions {
		for _, n := range rg.nodes {
			gz, err := n.ns.Gatewayz(nil)
			if err != nil {
				sc.t.Fatal(err)
			}
			for name, o := range gz.OutboundGateways {
				if o.Connection == nil || !slices.Contains(via, o.Connection.Port) {
					sc.t.Fatalf("%s's gateway connection to region %s is not through a proxy: %+v", n.name, name, o.Connection)
				}
			}
		}
	}
}

// servers is the number of nats-servers of every region.
func (sc *supercluster) servers() int {
	n := 0
	for _, rg := range sc.regions {
		n += len(rg.nodes)
	}
	return n
}

// gatewayTo reports whether ns has a live outbound gateway connection to
// the region named name, and how many inbound ones from it.
func gatewayTo(t *testing.T, ns *server.Server, name string) (out bool, in int) {
	t.Helper()
	gz, err := ns.Gatewayz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := gz.OutboundGateways[name]; o != nil && o.Connection != nil {
		out = true
	}
	return out, len(gz.InboundGateways[name])
}

// waitGateways waits until every node has its outbound gateway connection
// to the other region, and every node of the other region one to this
// region (each server opens one to a server of each other region, so a
// node may have no inbound one).
func (sc *supercluster) waitGateways() {
	sc.t.Helper()
	for _, rg := range sc.regions {
		for _, other := range sc.regions {
			if other == rg {
				continue
			}
			for _, n := range rg.nodes {
				testutil.Eventually(sc.t, formTimeout, n.name+"'s gateway to region "+other.name, func() bool {
					out, _ := gatewayTo(sc.t, n.ns, other.name)
					return out
				})
			}
			testutil.Eventually(sc.t, formTimeout, fmt.Sprintf("region %s's nodes to hold the %d gateways from region %s", rg.name, len(other.nodes), other.name), func() bool {
				in := 0
				for _, n := range rg.nodes {
					_, k := gatewayTo(sc.t, n.ns, other.name)
					in += k
				}
				return in == len(other.nodes)
			})
		}
	}
}

// lose shuts every node of rg down at once, as a region goes dark, and
// waits until the other regions' nodes have no gateway connection to it
// left. (One after the other, a Runner of the first node to go may
// reconnect to the next one in the middle of its shutdown, which then waits
// out the CONNECT's authorization timeout, 5 s, before it ends.)
func (sc *supercluster) lose(rg *region) {
	sc.t.Helper()
	var wg sync.WaitGroup
	for _, n := range rg.nodes {
		wg.Go(n.ns.Shutdown)
	}
	wg.Wait()
	for _, other := range sc.regions {
		if other == rg {
			continue
		}
		for _, n := range other.nodes {
			testutil.Eventually(sc.t, formTimeout, n.name+" to drop its gateway connections to the lost region "+rg.name, func() bool {
				out, in := gatewayTo(sc.t, n.ns, rg.name)
				return !out && in == 0
			})
		}
	}
}

// listingAnswers is how many servers answer one connection listing of the
// Runners' account asked on nc (the kick identity's connection), as the
// kicker asks it: every server that answers within a second of the request.
func listingAnswers(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(kick.SubjectConnzAll, inbox, []byte(`{"acc":"`+natsembed.Account+`","limit":1}`)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			return len(seen)
		}
		var r struct {
			Server struct {
				ID string `json:"id"`
			} `json:"server"`
		}
		if json.Unmarshal(m.Data, &r) == nil && r.Server.ID != "" {
			seen[r.Server.ID] = true
		}
	}
}

// startKicker runs the region's kicker (package kick, as compass-callout
// runs it beside its replicas): the kick identity on the region's first
// node, the region's own cluster file as its policy, its replicas' grants.
// It starts once a listing from that node is answered by all servers of
// every region: the system account's requests cross the gateways.
func (rg *region) startKicker(sweep time.Duration, servers int) {
	t := rg.t
	t.Helper()
	knc, err := nats.Connect(rg.nodes[0].url(), nats.UserInfo(natsembed.KickUser, natsembed.KickPassword), nats.Name("compass-callout-kick"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(knc.Close)
	testutil.Eventually(t, formTimeout, fmt.Sprintf("a listing from region %s to be answered by all %d servers", rg.name, servers), func() bool {
		return listingAnswers(t, knc) == servers
	})
	k, err := kick.New(kick.Config{Conn: knc, Account: natsembed.Account, Issuers: rg.replicas[0].r.RunnerIssuers(),
		Policy: callout.RevocationPolicy(rg.reg.Verifier(), nil, nil), SweepInterval: sweep,
		Logger: slog.New(slog.NewJSONHandler(rg.kickLog, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	rg.kicker.Store(k)
	onAuthorized := func(ev callout.Event) { k.Authorized(callout.GrantOf(ev)) }
	rg.authorized.Store(&onAuthorized)
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(requestTimeout):
			t.Errorf("region %s's kicker did not stop", rg.name)
		}
	})
}

// deny writes the region's cluster file with nodes on the deny list of the
// Kubernetes cluster of region of, and reloads it as SIGHUP does: the
// reload applies it, and the region's kicker is asked for a sweep.
func (rg *region) deny(of *region, nodes ...string) {
	rg.t.Helper()
	entries := slices.Clone(rg.entries)
	for i, sp := range regionSpecs {
		if sp.name == of.name {
			entries[i] += fmt.Sprintf("    deny:\n      nodes: [ %s ]\n", strings.Join(nodes, ", "))
		}
	}
	data := "clusters:\n" + strings.Join(entries, "")
	if err := os.WriteFile(rg.file, []byte(data), 0o600); err != nil {
		rg.t.Fatal(err)
	}
	if err := rg.reg.Reload(rg.t.Context()); err != nil {
		rg.t.Fatalf("region %s's cluster file: %v", rg.name, err)
	}
}

// kicks is the region's kicker's log records of connections it ended of
// Runner id, in order.
func (rg *region) kicks(id string) []map[string]any {
	rg.t.Helper()
	recs, err := rg.kickLog.JSONRecords("kick: runner connection ended")
	if err != nil {
		rg.t.Fatal(err)
	}
	var out []map[string]any
	for _, r := range recs {
		if r["runner_id"] == id {
			out = append(out, r)
		}
	}
	return out
}

// decisionsOf is every decision of the region's replicas about Runner id
// (an authorization names it; a refusal names its node in its reason).
func (rg *region) decisionsOf(h *runnerHandle) []callout.Event {
	var out []callout.Event
	for _, ev := range rg.allDecisions() {
		if ev.RunnerID == h.id || (ev.RunnerID == "" && strings.Contains(ev.Reason, h.kubeNode)) {
			out = append(out, ev)
		}
	}
	return out
}

// regionOf is the region whose Kubernetes cluster Runner id is of.
func (sc *supercluster) regionOf(id string) *region {
	for _, rg := range sc.regions {
		if strings.HasPrefix(id, rg.cluster+"/") {
			return rg
		}
	}
	sc.t.Fatalf("Runner %s is of no region", id)
	return nil
}

// checkOwnRegion checks that every authorization by every replica is of a
// Runner of the replica's own region, and waits until each region's
// replicas have authorized every Runner of it (a replica records its
// decision once the answer is out: the Runner may be connected first).
func (sc *supercluster) checkOwnRegion() {
	sc.t.Helper()
	for _, rg := range sc.regions {
		for _, h := range rg.runners {
			testutil.Eventually(sc.t, connectTimeout, fmt.Sprintf("region %s's replicas to have authorized its Runner %s", rg.name, h.id), func() bool {
				return slices.ContainsFunc(rg.decisionsOf(h), func(ev callout.Event) bool { return ev.Outcome == callout.OutcomeAuthorized })
			})
		}
		for _, rep := range rg.replicas {
			evs, _ := rep.log.since(0)
			for _, ev := range evs {
				if ev.Outcome != callout.OutcomeAuthorized {
					continue
				}
				if of := sc.regionOf(ev.RunnerID); of != rg {
					sc.t.Errorf("region %s's replica %s authorized %s, a Runner of region %s", rg.name, rep.name, ev.RunnerID, of.name)
				}
			}
		}
	}
}

// pingUntilAnswered pings Runner h through nc until it answers: the
// Runner's command subscription crosses a gateway (interest-only mode: the
// remote region learns of it after the Runner subscribed). It fails after
// formTimeout with the last error.
func pingUntilAnswered(t *testing.T, nc *nats.Conn, h *runnerHandle, what string) {
	t.Helper()
	deadline := time.NewTimer(formTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := pingOnce(nc, h.id)
		if err == nil {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for Runner %s to answer a ping %s: %v", formTimeout, h.id, what, err)
		}
	}
}
