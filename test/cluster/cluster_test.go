package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// calloutClients counts the compass-callout connections on ns.
func calloutClients(t *testing.T, ns *server.Server) int {
	t.Helper()
	return natsembed.ClientsNamed(t, ns, "compass-callout")
}

// ping sends the ping command as the Server does and checks the answer
// comes from the Runner id.
func ping(t *testing.T, nc *nats.Conn, id string) {
	t.Helper()
	if err := pingOnce(nc, id); err != nil {
		t.Fatal(err)
	}
}

// pingOnce is ping, saying what went wrong instead of failing the test: the
// request's error (nats.ErrNoResponders, nats.ErrTimeout) is wrapped.
func pingOnce(nc *nats.Conn, id string) error {
	subj, err := subjects.Command(id)
	if err != nil {
		return err
	}
	m, err := nc.Request(subj, []byte(`{"command":"ping"}`), requestTimeout)
	if err != nil {
		return fmt.Errorf("ping %s: %w", id, err)
	}
	var resp runner.Response
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("ping %s: answer is not an envelope: %v: %s", id, err, m.Data)
	}
	var res runner.PingResult
	if err := json.Unmarshal(resp.Result, &res); err != nil || !resp.OK || !res.Pong || res.RunnerID != id {
		return fmt.Errorf("ping %s: answer %s", id, m.Data)
	}
	return nil
}

// allDecisions is every decision of every replica.
func (tr *tier) allDecisions() []callout.Event {
	var all []callout.Event
	for _, rep := range tr.replicas {
		evs, _ := rep.log.since(0)
		all = append(all, evs...)
	}
	return all
}

// A Runner connects whichever node it reaches, also the node with no callout
// replica: its authorization request crosses a route to a replica on another
// node, which authorizes it.
func TestEveryRunnerConnectsOnAnyNode(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{0, 1}, runnersPerNode: 2})
	if n := calloutClients(t, tr.nodes[2].ns); n != 0 {
		t.Fatalf("n2 has %d callout connections, want none", n)
	}
	authorized, late := map[string]int{}, 0
	for _, ev := range tr.allDecisions() {
		switch {
		case ev.Outcome == callout.OutcomeAuthorized:
			authorized[ev.RunnerID]++
		case ev.Outcome == callout.OutcomeDropped && (ev.Reason == callout.DropPastHorizon || ev.Reason == callout.DropExpired):
			late++ // a loaded machine: the client gave up first and retries
		default:
			t.Fatalf("decision %s (%s) for %s", ev.Outcome, ev.Reason, ev.RunnerID)
		}
	}
	slow := int64(0)
	for _, h := range tr.runners {
		st := h.r.Link().Status()
		if st.AuthRefusals != 0 {
			t.Errorf("Runner %s: %d refusals", h.id, st.AuthRefusals)
		}
		// Once, or once more per CONNECT that gave up before the answer.
		if authorized[h.id] < 1 || int64(authorized[h.id]) > 1+st.SlowAuths {
			t.Errorf("Runner %s on %s authorized %d times with %d slow authorizations", h.id, tr.nodes[h.node].name, authorized[h.id], st.SlowAuths)
		}
		slow += st.SlowAuths
	}
	if len(authorized) != len(tr.runners) {
		t.Fatalf("%d Runners authorized, want %d", len(authorized), len(tr.runners))
	}
	if slow > 0 || late > 0 {
		t.Logf("first connects: %d slow authorizations, %d requests dropped late", slow, late)
	}
}

// The Server, connected to one node, reaches a Runner on each of the
// others: its request crosses the route to the Runner's node and the answer
// comes back.
func TestServerPingsRunnersOnOtherNodes(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{1, 2}, runnersPerNode: 1})
	srv := tr.serverConn(0)
	for _, at := range []int{1, 2} {
		for _, h := range tr.onNode(at) {
			cmd, _ := subjects.Command(h.id)
			tr.waitInterest(tr.nodes[0], natsembed.Account, cmd)
			ping(t, srv, h.id)
		}
	}
}

// A Runner on one node cannot reach another Runner's subjects on another
// node: publishing to its command or event subject and subscribing to its
// command subject or inbox are permission violations at the Runner's own
// node, and nothing crosses the route.
func TestRunnerCannotReachAnotherRunnerAcrossRoutes(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{0, 1}, runnersPerNode: 1})
	victim := tr.onNode(2)[0]
	srv0, srv2 := tr.serverConn(0), tr.serverConn(2)

	// A witness on the victim's node sees everything on the victim's subjects.
	all := subjects.Prefix + "." + victim.id + ".>"
	witness, err := srv2.SubscribeSync(all)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv2.Flush(); err != nil {
		t.Fatal(err)
	}
	tr.waitInterest(tr.nodes[0], natsembed.Account, all)

	// The rogue: a genuine Runner token of another node, connected to n0.
	tok, err := tr.issuer.Token(kubeissuer.Pod{NodeName: "rogue.example"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	asyncErrs := make(chan error, 16)
	rogue, err := nats.Connect(tr.nodes[0].url(), nats.Token(tok), nats.NoReconnect(),
		nats.CustomInboxPrefix(mustInbox(t, verifier.WorkloadRunnerID(clusterName, "rogue.example"))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { asyncErrs <- err }))
	if err != nil {
		t.Fatalf("rogue connect: %v", err)
	}
	defer rogue.Close()
	cmd, _ := subjects.Command(victim.id)
	evt, _ := subjects.Event(victim.id, "heartbeat")
	inbox, _ := subjects.InboxPrefix(victim.id)
	violation := func(what string) {
		t.Helper()
		want := fmt.Sprintf("%s: %s", nats.ErrPermissionViolation, what)
		select {
		case err := <-asyncErrs:
			if !errors.Is(err, nats.ErrPermissionViolation) || err.Error() != want {
				t.Fatalf("async error %v, want %s", err, want)
			}
		case <-time.After(requestTimeout):
			t.Fatalf("no permissions violation for %s", what)
		}
	}
	if err := rogue.Publish(cmd, []byte(`{"command":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	violation(fmt.Sprintf("Permissions Violation for Publish to %q", cmd))
	if err := rogue.Publish(evt, []byte(`{"forged":true}`)); err != nil {
		t.Fatal(err)
	}
	violation(fmt.Sprintf("Permissions Violation for Publish to %q", evt))
	stolenCmd, err := rogue.SubscribeSync(cmd)
	if err != nil {
		t.Fatal(err)
	}
	violation(fmt.Sprintf("Permissions Violation for Subscription to %q", cmd))
	stolenInbox, err := rogue.SubscribeSync(inbox + ".>")
	if err != nil {
		t.Fatal(err)
	}
	violation(fmt.Sprintf("Permissions Violation for Subscription to %q", inbox+".>"))

	// The Server's ping from n0 reaches the victim on n2 and nothing else:
	// the witness's first message is that ping, not the rogue's publishes,
	// which n0 refused before the Server's went out on the same route.
	ping(t, srv0, victim.id)
	m, err := witness.NextMsg(requestTimeout)
	if err != nil {
		t.Fatalf("the witness saw nothing: %v", err)
	}
	if m.Subject != cmd || string(m.Data) != `{"command":"ping"}` || m.Reply == "" {
		t.Fatalf("the witness's first message is on %s: %s", m.Subject, m.Data)
	}
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}
	for name, sub := range map[string]*nats.Subscription{"command": stolenCmd, "inbox": stolenInbox} {
		if n, _, _ := sub.Pending(); n != 0 {
			t.Fatalf("the rogue received %d messages on the victim's %s subject", n, name)
		}
	}
	if got := victim.evs.count(runner.EventDisconnected); got != 0 {
		t.Fatalf("the victim was disconnected %d times", got)
	}
}

func mustInbox(t *testing.T, id string) string {
	t.Helper()
	p, err := subjects.InboxPrefix(id)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// baseline is each Runner's event counts at one moment.
type baseline map[*runnerHandle]map[runner.LinkEventKind]int

func snapshot(hs []*runnerHandle) baseline {
	b := baseline{}
	for _, h := range hs {
		b[h] = h.evs.snapshot()
	}
	return b
}

// untouched checks that since base the Runners in it never lost their
// connection, were never refused and never waited too long for an
// authorization, and are still on their node.
func untouched(t *testing.T, tr *tier, base baseline) {
	t.Helper()
	for h, before := range base {
		now := h.evs.snapshot()
		for _, kind := range []runner.LinkEventKind{runner.EventDisconnected, runner.EventReconnected, runner.EventAuthError, runner.EventSlowAuth, runner.EventHandover} {
			if n := now[kind] - before[kind]; n != 0 {
				t.Errorf("Runner %s on %s had %d %s events", h.id, tr.nodes[h.node].name, n, kind)
			}
		}
		if st := h.r.Link().Status(); !st.Connected || st.ServerID != tr.nodes[h.node].ns.ID() {
			t.Errorf("Runner %s: connected %v to %s, want its node %s", h.id, st.Connected, st.ServerID, tr.nodes[h.node].name)
		}
	}
}

// A node stopped mid-run: its Runners reconnect to the others and are
// authorized again there; Runners on the surviving nodes notice nothing, and
// the Server reaches every Runner afterwards.
func TestNodeLossMovesOnlyItsRunners(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{1, 2}, runnersPerNode: 3})
	marks := make([]int, len(tr.replicas))
	for i, rep := range tr.replicas {
		_, marks[i] = rep.log.since(0)
	}
	gone := tr.nodes[0].ns.ID()
	survivors := snapshot(append(tr.onNode(1), tr.onNode(2)...))
	start := time.Now()
	tr.stop(0)

	moved := tr.onNode(0)
	var ids []string
	for _, h := range moved {
		h.evs.wait(t, runner.EventReconnected, 1, h.id)
		st := h.r.Link().Status()
		if !st.Connected || st.ServerID == gone {
			t.Fatalf("Runner %s after the loss: connected %v to %s", h.id, st.Connected, st.ServerID)
		}
		ids = append(ids, h.id)
	}
	t.Logf("%d Runners of the stopped node reconnected within %s", len(moved), time.Since(start).Round(time.Millisecond))
	// Each reconnect went through the callout again: some replica authorized
	// every moved Runner after the stop.
	reauth := map[string]bool{}
	for i, rep := range tr.replicas {
		evs, _ := rep.log.since(marks[i])
		for _, ev := range evs {
			if ev.Outcome == callout.OutcomeAuthorized {
				reauth[ev.RunnerID] = true
			}
		}
	}
	for _, id := range ids {
		if !reauth[id] {
			t.Errorf("Runner %s reconnected without a new authorization", id)
		}
	}
	untouched(t, tr, survivors)
	srv := tr.serverConn(1)
	for _, h := range tr.runners {
		cmd, _ := subjects.Command(h.id)
		tr.waitInterest(tr.nodes[1], natsembed.Account, cmd)
		ping(t, srv, h.id)
	}
}

// The callout replica connected to the stopped node is lost with it; the
// other replica answers every node's requests (the moved Runners' reconnects
// and fresh connects at both surviving nodes), and no CONNECT outside the
// stopped node fails.
func TestCalloutReplicaLostWithItsNode(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{0, 1}, runnersPerNode: 2})
	lost, other := tr.replicas[0], tr.replicas[1]
	_, lostMark := lost.log.since(0)
	_, mark := other.log.since(0)
	survivors := snapshot(append(tr.onNode(1), tr.onNode(2)...))
	tr.stop(0)
	testutil.Eventually(t, formTimeout, "the lost replica's connection to close", lost.nc.IsClosed)

	var moved []string
	for _, h := range tr.onNode(0) {
		h.evs.wait(t, runner.EventReconnected, 1, h.id)
		moved = append(moved, h.id)
	}
	other.log.waitAuthorized(t, mark, moved)

	// Fresh connects at both surviving nodes succeed at the first attempt,
	// answered by the remaining replica.
	var fresh []string
	for _, at := range []int{1, 2} {
		for k := range 2 {
			kubeNode := fmt.Sprintf("fresh-%d-%d.example", at, k)
			tok, err := tr.issuer.Token(kubeissuer.Pod{NodeName: kubeNode}, 0)
			if err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(tr.nodes[at].url(), nats.Token(tok), nats.NoReconnect())
			if err != nil {
				t.Fatalf("fresh connect at %s: %v", tr.nodes[at].name, err)
			}
			nc.Close()
			fresh = append(fresh, verifier.WorkloadRunnerID(clusterName, kubeNode))
		}
		h := tr.startRunner(at)
		h.evs.wait(t, runner.EventConnected, 1, h.id)
		fresh = append(fresh, h.id)
		if st := h.r.Link().Status(); st.ServerID != tr.nodes[at].ns.ID() || st.SlowAuths != 0 || st.AuthRefusals != 0 {
			t.Fatalf("fresh Runner at %s: %+v", tr.nodes[at].name, st)
		}
	}
	other.log.waitAuthorized(t, mark, fresh)

	evs, _ := other.log.since(mark)
	for _, ev := range evs {
		if ev.Outcome != callout.OutcomeAuthorized {
			t.Errorf("the remaining replica decided %s (%s) for %q", ev.Outcome, ev.Reason, ev.RunnerID)
		}
	}
	if late, _ := lost.log.since(lostMark); len(late) != 0 {
		t.Fatalf("the lost replica decided %d requests after its node stopped", len(late))
	}
	untouched(t, tr, survivors)
	slow := int64(0)
	for _, h := range tr.onNode(0) {
		slow += h.r.Link().Status().SlowAuths
	}
	// A moved Runner's reconnect may reach a node before that node dropped
	// its route to the stopped one, and its request go to the lost replica:
	// that CONNECT fails (slow authorization) and is retried. Reported, as it
	// is inside the stopped node's share.
	t.Logf("moved Runners: %d, their slow authorizations on the way: %d; remaining replica's decisions since the stop: %d", len(moved), slow, len(evs))
}

// The stopped node restarts on its ports and rejoins: routes to both others
// come back, the callout subscription is known on it across them, and new
// connects to it succeed; the Server reaches a Runner on it from another node.
func TestStoppedNodeRejoins(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{1, 2}, runnersPerNode: 1})
	tr.stop(0)
	tr.onNode(0)[0].evs.wait(t, runner.EventReconnected, 1, tr.onNode(0)[0].id)

	tr.start(0)
	tr.waitFormed()
	tr.waitInterest(tr.nodes[0], "CALLOUT", callout.Subject)
	tok, err := tr.issuer.Token(kubeissuer.Pod{NodeName: "after-restart.example"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(tr.nodes[0].url(), nats.Token(tok), nats.NoReconnect())
	if err != nil {
		t.Fatalf("connect to the restarted node: %v", err)
	}
	if got := nc.ConnectedServerId(); got != tr.nodes[0].ns.ID() {
		t.Fatalf("connected to %s, want the restarted n0", got)
	}
	nc.Close()
	h := tr.startRunner(0)
	h.evs.wait(t, runner.EventConnected, 1, h.id)
	if st := h.r.Link().Status(); st.ServerID != tr.nodes[0].ns.ID() || st.SlowAuths != 0 || st.AuthRefusals != 0 {
		t.Fatalf("new Runner at the restarted n0: %+v", st)
	}
	srv := tr.serverConn(2)
	cmd, _ := subjects.Command(h.id)
	tr.waitInterest(tr.nodes[2], natsembed.Account, cmd)
	ping(t, srv, h.id)
}
