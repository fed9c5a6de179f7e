package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// clusterEditBound bounds each edit's effect: the doors answer by the new
// file once both daemons logged it applied, and a live connection the edit
// refuses ends within about 0.3 s of the reload (docs/performance.md); the
// rest is slack for a loaded machine.
const clusterEditBound = 6 * time.Second

// docs/self-host.md's cluster procedures with the real compass-server and
// compass-callout binaries over one cluster file: adding a cluster, denying
// one of its nodes by name and removing the cluster are each an edit of the
// file followed by SIGHUP to both daemons. After each, the Server's door
// (Enroll) and NATS CONNECT through the callout decide alike: a cluster not
// yet added is refused at both, once added its Runners enroll and connect,
// the denied node is refused at both and its live NATS connection ends
// while its neighbour's stays, and once the cluster is removed the
// neighbour is refused and its connection ends too. The cluster that was
// there from the start is accepted throughout.
func TestClusterAddedDeniedAndRemovedBySIGHUPAtBothDoors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server", "compass-callout")
	dir := t.TempDir()
	prod, edge := testkeys.Issuer(t), testkeys.Issuer(t)
	prodEntry := verifiertest.ClusterEntry(t, prod, dir, "prod")
	edgeEntry := verifiertest.ClusterEntry(t, edge, dir, "edge")
	clusters := filepath.Join(dir, "clusters.yaml")
	write := func(content string) {
		t.Helper()
		// As the kubelet updates a mounted ConfigMap: the whole file at once.
		if err := os.WriteFile(clusters+".new", []byte("clusters:\n"+content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(clusters+".new", clusters); err != nil {
			t.Fatal(err)
		}
	}
	write(prodEntry)

	certFile, keyFile, caFile := servertest.TLS(t, dir)
	addr := testutil.FreeAddr(t)
	srv := startProc(t, filepath.Join(bin, "compass-server"), []string{"serve"},
		"COMPASS_LISTEN="+addr, "COMPASS_TLS_CERT="+certFile, "COMPASS_TLS_KEY="+keyFile,
		"COMPASS_RUNNER_CLUSTERS="+clusters, "COMPASS_DATA_DIR="+filepath.Join(dir, "server"))
	ns := natsembed.ServeForProcess(t, dir)
	co := startProc(t, filepath.Join(bin, "compass-callout"), nil, append(ns.Env(),
		"COMPASS_RUNNER_CLUSTERS="+clusters, "COMPASS_METRICS_ADDR="+testutil.FreeAddr(t))...)
	srv.waitLog(t, "door listening", 1)
	co.waitLog(t, "compass-callout answering", 1)

	// door enrolls tok at the Server's door: the Runner ID, or "" when the
	// door refuses it as unauthenticated. Keys still loading answer
	// Unavailable, which the Runner's enrollment retries, as here.
	door := func(tok string) string {
		t.Helper()
		c, err := enroll.New(enroll.Config{ServerURL: "https://" + addr, CAFile: caFile, Tokens: runner.StaticToken(tok)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), clusterEditBound)
		defer cancel()
		res, err := c.Enroll(ctx, runner.EnrollRequest{})
		switch {
		case err == nil:
			return res.RunnerID
		case connect.CodeOf(err) == connect.CodeUnauthenticated:
			return ""
		}
		t.Fatalf("Enroll: %v", err)
		return ""
	}
	// connectNATS connects with tok through the callout; a refusal is nil.
	// The returned channel is closed when the connection ends.
	connectNATS := func(tok string) (*nats.Conn, chan struct{}) {
		t.Helper()
		closed := make(chan struct{})
		nc, err := nats.Connect(ns.URL, nats.Token(tok), nats.NoReconnect(), nats.Timeout(clusterEditBound),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
		if errors.Is(err, nats.ErrAuthorization) || (err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization violation")) {
			return nil, nil
		}
		if err != nil {
			t.Fatalf("NATS CONNECT: %v", err)
		}
		t.Cleanup(nc.Close)
		return nc, closed
	}
	const applied = "clusterfile: cluster file applied"
	edit := func(content string, n int) {
		t.Helper()
		write(content)
		for _, p := range []*daemonProc{srv, co} {
			p.signal(t, syscall.SIGHUP)
			p.waitLog(t, applied, n)
		}
	}
	ended := func(what string, closed chan struct{}) {
		t.Helper()
		select {
		case <-closed:
		case <-time.After(clusterEditBound):
			t.Fatalf("%s's live NATS connection still open %s after the reload:\n%s", what, clusterEditBound, co.stderr)
		}
	}
	prodTok := testkeys.Token(t, prod, "p-1")
	acceptedAtBoth := func(what, tok, id string) (*nats.Conn, chan struct{}) {
		t.Helper()
		if got := door(tok); got != id {
			t.Fatalf("%s: the door enrolled %q, want %q", what, got, id)
		}
		// The callout loads the new cluster's keys after the reload, as the
		// Server does; meanwhile it answers keys unavailable, which a Runner
		// retries.
		var nc *nats.Conn
		var closed chan struct{}
		testutil.Eventually(t, clusterEditBound, what+": NATS accepts the token the door accepted", func() bool {
			nc, closed = connectNATS(tok)
			return nc != nil
		})
		return nc, closed
	}
	refusedAtBoth := func(what, tok string) {
		t.Helper()
		if got := door(tok); got != "" {
			t.Fatalf("%s: the door enrolled %q, want a refusal", what, got)
		}
		if nc, _ := connectNATS(tok); nc != nil {
			t.Fatalf("%s: NATS accepted a token the door refused", what)
		}
	}
	edge1, edge2 := testkeys.Token(t, edge, "e-1"), testkeys.Token(t, edge, "e-2")

	acceptedAtBoth("prod", prodTok, "prod/p-1")
	refusedAtBoth("edge before it is added", edge1)

	// Add a cluster.
	edit(prodEntry+edgeEntry, 1)
	_, closed1 := acceptedAtBoth("edge/e-1 once edge is added", edge1, "edge/e-1")
	nc2, closed2 := acceptedAtBoth("edge/e-2 once edge is added", edge2, "edge/e-2")

	// Deny a node.
	edit(prodEntry+edgeEntry+"    deny: { nodes: [e-1] }\n", 2)
	ended("edge/e-1, denied,", closed1)
	refusedAtBoth("edge/e-1 denied", edge1)
	if err := nc2.FlushTimeout(clusterEditBound); err != nil {
		t.Fatalf("edge/e-2's connection, not denied: %v", err)
	}
	acceptedAtBoth("edge/e-2 beside the denied node", edge2, "edge/e-2")

	// Remove the cluster.
	edit(prodEntry, 3)
	ended("edge/e-2, its cluster removed,", closed2)
	refusedAtBoth("edge/e-2 once edge is removed", edge2)
	acceptedAtBoth("prod after the edits", prodTok, "prod/p-1")

	for _, p := range []*daemonProc{srv, co} {
		for _, tok := range []string{prodTok, edge1, edge2} {
			if strings.Contains(p.stderr.String(), tok) {
				t.Fatalf("%s's log holds a token", p.name)
			}
		}
	}
}
