package cluster

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/test/natsembed"
)

// Settings of the supercluster tests, each with its reason.
const (
	// kickAcrossBound is the bound on a kick across regions: from
	// region A's cluster file reloaded with the deny to the end of the
	// denied node's Runner's connection in region B.
	kickAcrossBound = 2 * time.Second
	// pingPongSweep is region A's kicker's sweep interval in the deny test.
	// Production's is kick.DefaultSweepInterval (30 s); a second makes the
	// ping-pong of a deny in one region's file alone measurable in seconds.
	pingPongSweep = time.Second
	// pingPongKicks is how many times A's periodic sweep ends the Runner
	// that region B lets back in before the test applies the deny in B.
	pingPongKicks = 2
	// refusalsInARow is how many of region B's refusals in a row, and no
	// authorization, show the denied Runner stays out once both files
	// carry the deny.
	refusalsInARow = 3
	// handovers and handoverRefresh: each handover Runner of region B
	// reconnects early this many times, this often.
	handovers       = 3
	handoverRefresh = 300 * time.Millisecond
)

// A Runner in region B answers a ping from the Server's connection in
// region A, and a Runner in region A one from region B: the command and its
// answer cross the gateway.
func TestRunnersAnswerAcrossRegions(t *testing.T) {
	sc := newSupercluster(t, superOpts{replicas: [2][]int{{0, 1}, {0}}, runnersPerNode: 1})
	srvA, srvB := sc.a.serverConn(2), sc.b.serverConn(1)
	for _, c := range []struct {
		srv  *nats.Conn
		from *region
		to   *region
	}{{srvA, sc.a, sc.b}, {srvB, sc.b, sc.a}} {
		for _, h := range c.to.runners {
			pingUntilAnswered(t, c.srv, h, fmt.Sprintf("from region %s, on %s of region %s", c.from.name, c.to.nodes[h.node].name, c.to.name))
			// And again, at once: nothing was left to propagate.
			ping(t, c.srv, h.id)
		}
	}
	sc.checkOwnRegion()
}

// No authorization crosses a region: every request of a region's Runners
// is answered by a replica of that region, at the first connect and at
// every reconnect (region B's handover Runners reconnect early), and a
// Runner connects in region B while region A's replicas are stopped.
// nats-server hands a CONNECT's request to a queue subscriber of its own
// cluster first, and sends it over a gateway only when its cluster has none.
func TestRegionAuthorizesItsOwnRunners(t *testing.T) {
	sc := newSupercluster(t, superOpts{replicas: [2][]int{{0, 1}, {0, 1}}, runnersPerNode: 1})
	var hs []*runnerHandle
	for i := range sc.b.nodes {
		hs = append(hs, sc.b.startRunnerWith(i, func(lc *runner.LinkConfig) {
			lc.Refresh = handoverRefresh
			lc.CheckEvery = 10 * time.Millisecond
			lc.Jitter = func(time.Duration) time.Duration { return 0 }
		}))
	}
	for _, h := range hs {
		h.evs.wait(t, runner.EventConnected, 1, h.id)
		for i := 1; i <= handovers; i++ {
			h.evs.wait(t, runner.EventHandover, i, fmt.Sprintf("Runner %s, handover %d", h.id, i))
		}
	}
	byB := map[string]int{}
	for _, h := range hs {
		for _, ev := range sc.b.decisionsOf(h) {
			if ev.Outcome == callout.OutcomeAuthorized {
				byB[h.id]++
			}
		}
		if byB[h.id] < 1+handovers {
			t.Errorf("Runner %s: %d authorizations by region B's replicas for its connect and %d handovers", h.id, byB[h.id], handovers)
		}
		if evs := sc.a.decisionsOf(h); len(evs) != 0 {
			t.Errorf("region A's replicas decided %d requests of region B's Runner %s", len(evs), h.id)
		}
	}
	sc.checkOwnRegion()

	// Region A's replicas stop; a new Runner connects in region B at the
	// first attempt, authorized there.
	for _, rep := range sc.a.replicas {
		rep.stop()
	}
	for _, n := range sc.a.nodes {
		testutil.Eventually(t, formTimeout, n.name+" to have no callout connection", func() bool { return calloutClients(t, n.ns) == 0 })
	}
	h := sc.b.startRunner(0)
	h.evs.wait(t, runner.EventConnected, 1, h.id)
	if st := h.r.Link().Status(); st.ServerID != sc.b.nodes[0].ns.ID() || st.SlowAuths != 0 || st.AuthRefusals != 0 {
		t.Fatalf("new Runner in region B with region A's replicas stopped: %+v", st)
	}
	sc.checkOwnRegion()
	t.Logf("region B's replicas authorized the handover Runners %v times (connect and %d handovers each); region A's decided none of them", byB, handovers)
}

// When every callout replica of a region is gone, nats-server sends its
// CONNECTs' requests over the gateway to the queue group's members in the
// other region, which answer from their own cluster file: the region's
// Runners still connect. That is the one authorization that crosses a
// region, and only while a region has no replica of its own.
func TestRegionWithoutReplicasIsServedAcrossTheGateway(t *testing.T) {
	sc := newSupercluster(t, superOpts{replicas: [2][]int{{0}, {0}}})
	for _, rep := range sc.b.replicas {
		rep.stop()
	}
	for _, n := range sc.b.nodes {
		testutil.Eventually(t, formTimeout, n.name+" to know of no callout subscriber in its region", func() bool {
			acc, err := n.ns.LookupAccount("CALLOUT")
			if err != nil {
				t.Fatal(err)
			}
			return !acc.SubscriptionInterest(callout.Subject)
		})
	}
	_, mark := sc.a.replicas[0].log.since(0)
	h := sc.b.startRunner(1)
	h.evs.wait(t, runner.EventConnected, 1, h.id)
	sc.b.place(h)
	st := h.r.Link().Status()
	if st.AuthRefusals != 0 {
		t.Fatalf("Runner in region B without replicas: %+v", st)
	}
	sc.a.replicas[0].log.waitAuthorized(t, mark, []string{h.id})
	t.Logf("region B's Runner connected through region A's replica (%d slow authorizations)", st.SlowAuths)
}

// A node denied in region A's cluster file has its Runner in region B
// kicked within 2 s: A's kicker lists and kicks across the gateway. Region
// B's callout still lets the node in (its own file does not deny it), so
// the Runner reconnects through B, and A's periodic sweep kicks it again
// every sweep interval: a ping-pong, measured here with a 1 s sweep (30 s
// in production). Once B's file carries the deny too, B's callout refuses
// the node and the Runner stays out. Every other Runner is untouched.
func TestNodeDeniedInOneRegionIsKickedInTheOther(t *testing.T) {
	sc := newSupercluster(t, superOpts{replicas: [2][]int{{0}, {0}}, runnersPerNode: 1, kick: true, sweep: [2]time.Duration{pingPongSweep, 0}})
	victim := sc.b.onNode(1)[0]
	var others []*runnerHandle
	for _, rg := range sc.regions {
		for _, h := range rg.runners {
			if h != victim {
				others = append(others, h)
			}
		}
	}
	base := snapshot(others)

	// The deny in region A's file alone.
	start := time.Now()
	sc.a.deny(sc.b, victim.kubeNode)
	victim.evs.wait(t, runner.EventDisconnected, 1, "the denied Runner "+victim.id)
	took := victim.evs.times(runner.EventDisconnected)[0].Sub(start)
	// The kicker logs a kick once its server answered: the Runner may see
	// the end of its connection first.
	testutil.Eventually(t, requestTimeout, "region A's kicker to log the kick of "+victim.id, func() bool { return len(sc.a.kicks(victim.id)) > 0 })
	// Its trigger is the reload's sweep, or a periodic one that had listed
	// before the reload and judged after it.
	if first := sc.a.kicks(victim.id)[0]; first["reason"] != "node_denied" || first["server"] != sc.b.nodes[victim.node].name {
		t.Fatalf("region A's kicker's first kick of %s: %v", victim.id, first)
	}
	if k := sc.b.kicks(victim.id); len(k) != 0 {
		t.Fatalf("region B's kicker, whose file does not deny the node, kicked it: %v", k)
	}
	t.Logf("node %s denied in region A's cluster file: its Runner on %s in region B kicked by region A's kicker %s after the reload", victim.kubeNode, sc.b.nodes[victim.node].name, took.Round(time.Millisecond))
	if took > kickAcrossBound {
		t.Fatalf("the kick across regions took %s, over %s", took, kickAcrossBound)
	}

	// Region B lets it back in, and A's periodic sweep ends it again.
	testutil.Eventually(t, connectTimeout, fmt.Sprintf("%d more kicks of %s by region A's periodic sweep", pingPongKicks, victim.id), func() bool {
		kicks, periodic := sc.a.kicks(victim.id), 0
		for _, r := range kicks {
			if strings.Contains(fmt.Sprint(r["trigger"]), "periodic") {
				periodic++
			}
		}
		return len(kicks) >= 1+pingPongKicks && periodic >= pingPongKicks
	})
	kicks := sc.a.kicks(victim.id)
	victim.evs.wait(t, runner.EventReconnected, len(kicks), victim.id+"'s reconnect after each kick")
	downs := victim.evs.times(runner.EventDisconnected)
	ups := victim.evs.times(runner.EventReconnected)
	var gaps, back []string
	for i := 1; i < len(kicks); i++ {
		gaps = append(gaps, kickTime(t, kicks[i]).Sub(kickTime(t, kicks[i-1])).Round(time.Millisecond).String())
	}
	for i := range min(len(downs), len(ups)) {
		back = append(back, ups[i].Sub(downs[i]).Round(time.Millisecond).String())
	}
	t.Logf("deny in region A's file alone: %d kicks by A (triggers %v), %s apart with a %s sweep; back through region B after %v",
		len(kicks), triggers(kicks), strings.Join(gaps, ", "), pingPongSweep, strings.Join(back, ", "))
	// A replica records its decision once the answer is out.
	testutil.Eventually(t, requestTimeout, fmt.Sprintf("region B's authorizations of %s for its first connect and %d reconnects", victim.id, len(ups)), func() bool {
		return len(sc.b.decisionsOf(victim)) >= 1+len(ups)
	})
	for _, ev := range sc.b.decisionsOf(victim) {
		if ev.Outcome != callout.OutcomeAuthorized {
			t.Fatalf("region B's replica, whose file does not deny the node, decided %s (%s)", ev.Outcome, ev.Reason)
		}
	}

	// The deny in region B's file too: B refuses the node, and the Runner
	// stays out.
	sc.b.deny(sc.b, victim.kubeNode)
	testutil.Eventually(t, connectTimeout, fmt.Sprintf("%d refusals of %s by region B's replica, each seen by the Runner", refusalsInARow, victim.id), func() bool {
		n := 0
		for _, ev := range sc.b.decisionsOf(victim) {
			if ev.Outcome == callout.OutcomeDenied {
				n++
			}
		}
		return n >= refusalsInARow && victim.r.Link().Status().AuthRefusals >= refusalsInARow
	})
	evs := sc.b.decisionsOf(victim)
	firstRefusal := -1
	for i, ev := range evs {
		switch {
		case ev.Outcome == callout.OutcomeDenied && firstRefusal < 0:
			firstRefusal = i
			if !strings.Contains(ev.Reason, "deny.nodes") {
				t.Errorf("region B's refusal of %s: %q, want the deny list named", victim.id, ev.Reason)
			}
		case ev.Outcome == callout.OutcomeAuthorized && firstRefusal >= 0:
			t.Fatalf("region B authorized %s after refusing it", victim.id)
		}
	}
	if st := victim.r.Link().Status(); st.Connected || st.AuthRefusals < refusalsInARow {
		t.Fatalf("the Runner of the node denied in both regions: %+v", st)
	}
	if evs := sc.a.decisionsOf(victim); len(evs) != 0 {
		t.Fatalf("region A's replica decided %d requests of region B's Runner", len(evs))
	}
	for _, rg := range sc.regions {
		mine := baseline{}
		for h, b := range base {
			if sc.regionOf(h.id) == rg {
				mine[h] = b
			}
		}
		untouched(t, rg.tier, mine)
	}
	t.Logf("deny in both files: region B refused %d CONNECTs of %s, authorized none", len(evs)-firstRefusal, victim.id)
}

// kickTime is when a kick log record was written.
func kickTime(t *testing.T, r map[string]any) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func triggers(recs []map[string]any) []string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprint(r["trigger"]))
	}
	return out
}

// Losing a whole region (every nats-server of it shut down) leaves the
// other region's Runners connected where they were, answering the Server's
// connection in their region, with no reconnect; a Server connection given
// both regions' URLs moves to the surviving region and reaches them too,
// and new Runners connect there.
func TestRegionLossLeavesTheOtherAnswering(t *testing.T) {
	for _, lost := range []string{"a", "b"} {
		t.Run("lose region "+lost, func(t *testing.T) {
			// In parallel: each waits out its lost replica's drain at the end.
			t.Parallel()
			sc := newSupercluster(t, superOpts{replicas: [2][]int{{0}, {0}}, runnersPerNode: 1, kick: true})
			gone, kept := sc.a, sc.b
			if lost == "b" {
				gone, kept = sc.b, sc.a
			}
			srv := kept.serverConn(len(kept.nodes) - 1)
			var urls []string
			for _, rg := range []*region{gone, kept} {
				for _, n := range rg.nodes {
					urls = append(urls, n.url())
				}
			}
			// The Server's connection, given the lost region's URLs first.
			fo, err := nats.Connect(strings.Join(urls, ","), nats.UserInfo(natsembed.ServerUser, natsembed.ServerPassword),
				nats.Name("compass-server"), nats.DontRandomize(), nats.ReconnectWait(100*time.Millisecond), nats.MaxReconnects(-1))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fo.Close)
			if fo.ConnectedServerId() != gone.nodes[0].ns.ID() {
				t.Fatalf("the failing-over Server connection is on %s, want region %s's first node", fo.ConnectedServerId(), gone.name)
			}
			for _, h := range kept.runners {
				ping(t, srv, h.id)
			}
			base := snapshot(kept.runners)
			start := time.Now()
			sc.lose(gone)
			for _, h := range kept.runners {
				ping(t, srv, h.id)
			}
			untouched(t, kept.tier, base)
			testutil.Eventually(t, connectTimeout, "the Server connection to move to region "+kept.name, func() bool {
				id := fo.ConnectedServerId()
				for _, n := range kept.nodes {
					if fo.IsConnected() && n.ns.ID() == id {
						return true
					}
				}
				return false
			})
			for _, h := range kept.runners {
				pingUntilAnswered(t, fo, h, "through the Server connection that moved to region "+kept.name)
			}
			moved := time.Since(start)
			h := kept.startRunner(0)
			h.evs.wait(t, runner.EventConnected, 1, h.id)
			if st := h.r.Link().Status(); st.ServerID != kept.nodes[0].ns.ID() || st.SlowAuths != 0 || st.AuthRefusals != 0 {
				t.Fatalf("new Runner in region %s after region %s's loss: %+v", kept.name, gone.name, st)
			}
			untouched(t, kept.tier, base)
			t.Logf("region %s lost: region %s's %d Runners untouched and answering; the Server connection reached them through region %s %s after the loss began",
				gone.name, kept.name, len(base), kept.name, moved.Round(time.Millisecond))
		})
	}
}

// A gateway partition (every gateway connection cut, both regions up)
// leaves each region to itself: its Runners stay connected and answer its
// Server connection, new Runners connect through its own replicas, and a
// ping to the other region's Runner finds no responders. A node denied in
// region A's file alone then keeps its Runner in region B: A's kicker lists
// A's servers only. Denied in region B's file too, it is ended within 2 s by
// B's own kicker: during a partition a deny holds in the regions whose file
// carries it, and nowhere else.
func TestGatewayPartitionLeavesEachRegionToItself(t *testing.T) {
	sc := newSupercluster(t, superOpts{replicas: [2][]int{{0}, {0}}, runnersPerNode: 1, kick: true, partitionable: true})
	srv := map[*region]*nats.Conn{sc.a: sc.a.serverConn(0), sc.b: sc.b.serverConn(0)}
	victim := sc.b.onNode(1)[0]
	pingUntilAnswered(t, srv[sc.a], victim, "from region A before the partition")
	bases := map[*region]baseline{}
	for _, rg := range sc.regions {
		bases[rg] = snapshot(rg.runners)
	}

	sc.partition()
	for _, rg := range sc.regions {
		for _, h := range rg.runners {
			ping(t, srv[rg], h.id)
		}
		untouched(t, rg.tier, bases[rg])
	}
	testutil.Eventually(t, formTimeout, "a ping from region A to region B's Runner to find no responders", func() bool {
		return errors.Is(pingOnce(srv[sc.a], victim.id), nats.ErrNoResponders)
	})
	for _, rg := range sc.regions {
		h := rg.startRunner(0)
		h.evs.wait(t, runner.EventConnected, 1, h.id)
		if st := h.r.Link().Status(); st.ServerID != rg.nodes[0].ns.ID() || st.SlowAuths != 0 || st.AuthRefusals != 0 {
			t.Fatalf("new Runner in region %s during the partition: %+v", rg.name, st)
		}
	}
	sc.checkOwnRegion()

	// The deny in region A's file alone. A's kicker's index, made before
	// the partition, still shows the Runner in region B: the sweep after
	// the reload may judge it and try to end it, which cannot reach B (the
	// kick finds no server to answer it, logged and retried); the retry
	// lists the servers, hears A's three alone and ends nothing. Either way
	// the first successful sweep after the reload is a listing of A's three
	// servers that ends nothing.
	sweeps := func() []map[string]any {
		recs, err := sc.a.kickLog.JSONRecords("kick: sweep")
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	mark := len(sweeps())
	sc.a.deny(sc.b, victim.kubeNode)
	var after map[string]any
	testutil.Eventually(t, requestTimeout, "region A's kicker's listing of its own servers after the reload", func() bool {
		for _, r := range sweeps()[mark:] {
			if r["by"] == "listing" {
				after = r
				return true
			}
		}
		return false
	})
	if after["servers"] != float64(len(sc.a.nodes)) || after["ended"] != float64(0) {
		t.Fatalf("region A's sweep during the partition: %v; want its %d servers heard and nothing ended", after, len(sc.a.nodes))
	}
	if n := victim.evs.count(runner.EventDisconnected); n != 0 || len(sc.a.kicks(victim.id)) != 0 {
		t.Fatalf("the Runner denied in region A's file alone was ended during the partition (%d disconnects)", n)
	}
	ping(t, srv[sc.b], victim.id)

	// The deny in region B's file too: B's kicker ends it.
	start := time.Now()
	sc.b.deny(sc.b, victim.kubeNode)
	victim.evs.wait(t, runner.EventDisconnected, 1, "the Runner denied in region B's file")
	took := victim.evs.times(runner.EventDisconnected)[0].Sub(start)
	testutil.Eventually(t, requestTimeout, "region B's kicker to log the kick of "+victim.id, func() bool { return len(sc.b.kicks(victim.id)) > 0 })
	if k := sc.b.kicks(victim.id)[0]; k["reason"] != "node_denied" {
		t.Fatalf("region B's kick: %v", k)
	}
	if took > kickAcrossBound {
		t.Fatalf("region B's kick took %s, over %s", took, kickAcrossBound)
	}
	testutil.Eventually(t, connectTimeout, "region B's replica to refuse "+victim.id, func() bool {
		for _, ev := range sc.b.decisionsOf(victim) {
			if ev.Outcome == callout.OutcomeDenied {
				return true
			}
		}
		return false
	})
	t.Logf("partition: region A's sweep after its deny heard %v servers and ended nothing; region B's deny ended the Runner %s after B's reload", after["servers"], took.Round(time.Millisecond))
}
