package runner

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
)

// cmdSubscriptions counts, from the server's side, the subscriptions on
// subject in the Runners' account, and the connections holding them.
func cmdSubscriptions(t *testing.T, ns *server.Server, subject string) (subs, conns int) {
	t.Helper()
	cz, err := ns.Connz(&server.ConnzOptions{Subscriptions: true, SubscriptionsDetail: true, Account: natsembed.Account, Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		n := 0
		for _, s := range c.SubsDetail {
			if s.Subject == subject {
				n++
			}
		}
		if n > 0 {
			subs += n
			conns++
		}
	}
	return subs, conns
}

// waitOneCmdSubscription waits until exactly one connection holds exactly
// one subscription on subject (a handover's old session drains after the
// new one took over).
func waitOneCmdSubscription(t *testing.T, ns *server.Server, subject string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		subs, conns := cmdSubscriptions(t, ns, subject)
		if subs == 1 && conns == 1 {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("%d subscriptions on %s over %d connections, want exactly one", subs, subject, conns)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A Runner holds exactly one subscription on its cmd subject, on one
// connection, before and after early reconnects: the user JWT's reply
// allowance is per request, and a second subscriber on the subject (in or
// out of the queue group) would take commands the Runner cannot answer
// (DL-316.2). Its subscriptions are its cmd subject and its own inbox, and
// no more than the user JWT's limit.
func TestRunnerHoldsExactlyOneCmdSubscription(t *testing.T) {
	st := newStack(t, stackOpts{})
	node := "node-subs"
	id := st.runnerID(node)
	_, evs, _, path, _ := daemonSetRunner(t, st, node)
	cmd, err := subjects.Command(id)
	if err != nil {
		t.Fatal(err)
	}
	if resp := command(t, st.server, id, `{"command":"ping"}`); !resp.OK {
		t.Fatalf("ping = %+v", resp)
	}
	waitOneCmdSubscription(t, st.ns, cmd)

	cz, err := st.ns.Connz(&server.ConnzOptions{Subscriptions: true, SubscriptionsDetail: true, Account: natsembed.Account})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		var mine []string
		for _, s := range c.SubsDetail {
			mine = append(mine, s.Subject)
		}
		if !slices.Contains(mine, cmd) {
			continue
		}
		if len(mine) > 2 {
			t.Fatalf("the Runner's connection holds %d subscriptions %v, want its cmd subject and its inbox", len(mine), mine)
		}
		for _, s := range c.SubsDetail {
			if s.Subject == cmd && s.Queue != cmdQueue {
				t.Fatalf("cmd subscription in queue %q, want %q", s.Queue, cmdQueue)
			}
		}
	}

	for i := 1; i <= 2; i++ {
		if _, err := st.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
			t.Fatal(err)
		}
		evs.wait(t, 10*time.Second, "early reconnect", count(EventHandover, i))
		waitOneCmdSubscription(t, st.ns, cmd)
		if resp := command(t, st.server, id, `{"command":"ping"}`); !resp.OK {
			t.Fatalf("ping after rotation %d = %+v", i, resp)
		}
	}
}
