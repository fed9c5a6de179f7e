package cluster

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
)

// Settings of the cross-node handover test, each with its reason.
const (
	// crossHandovers is how many early reconnects the Runner makes, each onto
	// the other node of the two it alternates between. One ping in some
	// hundreds used to be lost at a handover's end (issue 33); forty
	// handovers at crossPingEvery send some four hundred pings across them.
	crossHandovers = 40
	// crossRefresh makes the handovers come one after the other: the link
	// reconnects early at 70 % of it after each connect (the jitter is zero).
	crossRefresh = 150 * time.Millisecond
	// crossPingEvery is the Server's ping rate during the handovers.
	crossPingEvery = 50 * time.Millisecond
	// crossRouteDelay is how late what n1 sends over its routes arrives: n1
	// stands for a node in another zone. On loopback a route's message
	// takes microseconds, and the new subscription's interest reaches the
	// third node first whatever the handover does; across zones it takes
	// milliseconds, and the old node's unsubscription can overtake it.
	// Without an overlap each of the twenty moves to n1 leaves n2 this long
	// without interest: a ping in it finds no responders, about twenty
	// pings lost in all.
	crossRouteDelay = 50 * time.Millisecond
	// crossOverlap is the handovers' overlap: the production value. A
	// shorter one (200 ms, with 20 ms routes) lost one ping in a
	// CI run whose two cores were busy with the other packages' tests: the
	// bound is a margin over the route delay, and a starved node eats it.
	crossOverlap = runner.DefaultHandoverOverlap
)

// hopDialer dials, for every connection of the Runner's link, the node of
// a and b that the link's current session is not on: each handover (and
// each retry of one) lands on the other node, as a load balancer in front
// of the cluster may do. The address nats.go asks for is ignored; the
// plaintext guard, which wraps this dialer, has already checked it.
type hopDialer struct {
	tr   *tier
	a, b int
	r    atomic.Pointer[runner.Runner] // nil until the Runner is started: dial a
	d    net.Dialer
}

func (d *hopDialer) Dial(network, _ string) (net.Conn, error) {
	to := d.a
	if r := d.r.Load(); r != nil {
		if l := r.Link(); l != nil && l.Status().ServerID == d.tr.nodes[d.a].ns.ID() {
			to = d.b
		}
	}
	return d.d.Dial(network, fmt.Sprintf("127.0.0.1:%d", d.tr.nodes[to].port))
}

// pinger is the Server pinging one Runner at a steady rate, counting what
// came back.
type pinger struct {
	answered, noResponders atomic.Int64
	mu                     sync.Mutex
	lost                   []string
}

// run pings id through nc every crossPingEvery until stop is closed; at
// counts the handovers so far, for the record of a lost ping.
func (p *pinger) run(nc *nats.Conn, id string, stop <-chan struct{}, at func() int) {
	tick := time.NewTicker(crossPingEvery)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		sentAt := at()
		err := pingOnce(nc, id)
		switch {
		case err == nil:
			p.answered.Add(1)
			continue
		case errors.Is(err, nats.ErrNoResponders):
			p.noResponders.Add(1)
		}
		p.mu.Lock()
		p.lost = append(p.lost, fmt.Sprintf("ping %d, sent after %d handovers: %v", n, sentAt, err))
		p.mu.Unlock()
	}
}

// A Runner hands over between two nodes forty times, every time onto the
// node its old connection is not on, while the Server, connected to the
// third node, pings it every 50 ms: no ping is lost. The new connection's
// command subscription reaches the third node over a route from the new
// node, while the old connection's unsubscription reaches it over another
// route from the old node; n1's routes are 50 ms long, so on every move to
// n1 the unsubscription from n0 arrives first unless the handover keeps the
// old subscription until the new one is known across the cluster
// (runner.DefaultHandoverOverlap, which crossOverlap is).
func TestHandoverToAnotherNodeLosesNoPing(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{0, 1}, farNode: 1, farDelay: crossRouteDelay})
	hop := &hopDialer{tr: tr, a: 0, b: 1}
	var (
		movesMu sync.Mutex
		moves   []string // the server ID after each handover
	)
	h := tr.startRunnerWith(0, func(lc *runner.LinkConfig) {
		lc.Refresh = crossRefresh
		lc.HandoverOverlap = crossOverlap
		lc.CheckEvery = 10 * time.Millisecond
		lc.Jitter = func(time.Duration) time.Duration { return 0 }
		lc.Options = append(lc.Options, nats.SetCustomDialer(hop))
		record := lc.OnEvent
		lc.OnEvent = func(ev runner.LinkEvent) {
			if r := hop.r.Load(); ev.Kind == runner.EventHandover && r != nil {
				id := r.Link().Status().ServerID
				movesMu.Lock()
				moves = append(moves, id)
				movesMu.Unlock()
			}
			record(ev)
		}
	})
	hop.r.Store(h.r)
	h.evs.wait(t, runner.EventConnected, 1, "Runner "+h.id+" first connect")
	if st := h.r.Link().Status(); st.ServerID != tr.nodes[0].ns.ID() {
		t.Fatalf("the Runner's first connection is on %q, want n0", st.ServerID)
	}
	cmd, _ := subjects.Command(h.id)
	tr.waitInterest(tr.nodes[2], natsembed.Account, cmd)

	srv := tr.serverConn(2)
	var p pinger
	stop, stopped := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		p.run(srv, h.id, stop, func() int { return h.evs.count(runner.EventHandover) })
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()
	for i := 1; i <= crossHandovers; i++ {
		h.evs.wait(t, runner.EventHandover, i, fmt.Sprintf("Runner %s, handover %d", h.id, i))
	}
	took := time.Since(start)
	close(stop)
	select {
	case <-stopped:
	case <-time.After(requestTimeout + time.Second):
		t.Fatal("the pinger did not stop within one request's timeout")
	}

	movesMu.Lock()
	got := slices.Clone(moves)
	movesMu.Unlock()
	n0, n1 := tr.nodes[0].ns.ID(), tr.nodes[1].ns.ID()
	prev := n0
	for i, id := range got[:crossHandovers] {
		if id != n0 && id != n1 {
			t.Fatalf("after handover %d the Runner is on %q, neither n0 nor n1", i+1, id)
		}
		if id == prev {
			t.Fatalf("handover %d stayed on %s", i+1, id)
		}
		prev = id
	}
	st := h.r.Link().Status()
	t.Logf("%d handovers between n0 and n1 in %s; pings from n2: %d answered, %d lost (%d no responders); link %d reconnects, %d slow authorizations",
		crossHandovers, took.Round(time.Millisecond), p.answered.Load(), len(p.lost), p.noResponders.Load(), st.Reconnects, st.SlowAuths)
	if len(p.lost) != 0 {
		t.Fatalf("%d pings lost:\n%s", len(p.lost), strings.Join(p.lost, "\n"))
	}
	if p.answered.Load() < crossHandovers/2 {
		t.Fatalf("only %d pings answered over %d handovers: the pings did not span them", p.answered.Load(), crossHandovers)
	}
	if n := h.evs.count(runner.EventDisconnected); n != 0 || st.Reconnects != 0 {
		t.Fatalf("the Runner lost its connection %d times (%d reconnects): the handovers are not what was tested", n, st.Reconnects)
	}
}

// The handover's overlap fits inside the callout's duplicate grace: a
// Runner's old connection ends (overlap, then a drain of at most
// runner.DrainTimeout) before the callout would take it for a copy, and a
// quick handover stays under even the shortest grace allowed.
func TestHandoverOverlapFitsTheDuplicateGrace(t *testing.T) {
	if runner.DefaultHandoverOverlap >= kick.MinDuplicateGrace {
		t.Errorf("overlap %s, shortest duplicate grace %s", runner.DefaultHandoverOverlap, kick.MinDuplicateGrace)
	}
	if d := runner.DefaultHandoverOverlap + runner.DrainTimeout; d >= kick.DefaultDuplicateGrace {
		t.Errorf("overlap and drain %s, default duplicate grace %s", d, kick.DefaultDuplicateGrace)
	}
}
