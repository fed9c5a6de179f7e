package runner

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
)

// The overlap of a handover never runs past half of what is left of the old
// session's authorization, as the token it sent and the observed user-JWT
// lifetime tell it; with neither known it is the configured overlap.
func TestHandoverOverlapStaysWithinTheOldAuthorization(t *testing.T) {
	const overlap = 3 * time.Second // JWT times are whole seconds
	now := newClock().Now()
	withExp := func(d time.Duration) *string {
		tok := signedToken(t, now.Add(d))
		return &tok
	}
	noExp := signedToken(t, time.Time{})
	connected := now.Add(-4 * time.Second).UnixNano()
	for _, tc := range []struct {
		name      string
		sent      *string
		connected int64
		learned   time.Duration
		want      time.Duration
	}{
		{"nothing known", nil, 0, 0, overlap},
		{"a token without exp", &noExp, connected, 0, overlap},
		{"the token far from its exp", withExp(time.Hour), connected, 0, overlap},
		{"the token 4 s from its exp", withExp(4 * time.Second), connected, 0, 2 * time.Second},
		{"the token expired", withExp(-time.Second), connected, 0, 0},
		{"the user JWT 10 s after a connect 4 s ago", withExp(time.Hour), connected, 10 * time.Second, overlap},
		{"the user JWT 5 s after a connect 4 s ago", withExp(time.Hour), connected, 5 * time.Second, 500 * time.Millisecond},
		{"the user JWT already past", nil, connected, 3 * time.Second, 0},
		{"a lifetime but no connect time", nil, 0, time.Second, overlap},
		{"both: the nearer wins", withExp(2 * time.Second), connected, 10 * time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := overlapWithin(overlap, now, tc.sent, tc.connected, tc.learned); got != tc.want {
				t.Fatalf("overlap = %s, want %s", got, tc.want)
			}
		})
	}
}

// snapshot is the events so far.
func (e *events) snapshot() []LinkEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.all)
}

// runnerConns counts the server's connections authorized as the Runner id.
func runnerConns(t *testing.T, ns *server.Server, id string) int {
	t.Helper()
	cz, err := ns.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cz.Conns {
		if c.AuthorizedUser == id {
			n++
		}
	}
	return n
}

// During a handover's overlap both sessions are connected and the Runner
// answers; a shutdown then does not wait for the overlap's end: the link
// drains both sessions and Run returns within the drain's bound.
func TestShutdownDuringHandoverOverlapDrainsBoth(t *testing.T) {
	st := newStack(t, stackOpts{})
	const node = "node-overlap"
	id := st.runnerID(node)
	path := st.tokenFile(t, node, 0)
	evs := newEvents()
	log, _ := newLog(t)
	r, err := New(Config{RunnerID: id, Tokens: NewFileToken(path, nil, nil), TokenFile: path, NATSURL: st.url, Heartbeat: -1, Logger: log,
		Link: LinkConfig{CheckEvery: 20 * time.Millisecond, RotateJitter: time.Millisecond, HandoverOverlap: time.Hour, OnEvent: evs.add}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	evs.wait(t, 10*time.Second, "connected", count(EventConnected, 1))
	if _, err := st.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the new session beside the old", func() bool { return runnerConns(t, st.ns, id) == 2 })
	if resp := command(t, st.server, id, `{"command":"ping"}`); !resp.OK {
		t.Fatalf("ping during the overlap = %+v", resp)
	}
	if count(EventHandover, 1)(evs.snapshot()) {
		t.Fatal("a handover event before the overlap ended")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(DrainTimeout + 5*time.Second):
		t.Fatal("Run did not return within the drain's bound after a shutdown during the overlap")
	}
	testutil.Eventually(t, 5*time.Second, "the server to drop both sessions", func() bool { return runnerConns(t, st.ns, id) == 0 })
}
