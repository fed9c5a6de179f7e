package door_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// enroll calls the door's Enroll with tok.
func (d *daemons) enroll(t *testing.T, tok string) error {
	t.Helper()
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+tok)
	_, err := runnerv1connect.NewRunnerServiceClient(d.doorClient, d.doorURL, connect.WithGRPC()).Enroll(t.Context(), req)
	return err
}

// connectNATS connects to NATS with tok, as a Runner does.
func (d *daemons) connectNATS(t *testing.T, tok string) error {
	t.Helper()
	nc, err := nats.Connect(d.natsURL, nats.Token(tok), nats.NoReconnect(), nats.Timeout(waitFor))
	if err == nil {
		nc.Close()
	}
	return err
}

// running fails the test if either daemon has returned.
func (d *daemons) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-d.serverDone:
		t.Fatalf("server.Serve returned: %v\n%s", err, d.serverLog)
	case err := <-d.calloutDone:
		t.Fatalf("callout.Serve returned: %v\n%s", err, d.calloutLog)
	default:
	}
}

// waitLogged waits until log holds n lines containing msg: the daemons log
// each reload's outcome once it is in force.
func waitLogged(t *testing.T, log *testlog.Buffer, msg string, n int) {
	t.Helper()
	deadline := time.After(waitFor)
	for strings.Count(log.String(), msg) < n {
		select {
		case <-deadline:
			t.Fatalf("%d of %q logged, want %d:\n%s", strings.Count(log.String(), msg), msg, n, log)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// replace writes content to path as an editor or a ConfigMap update does:
// a new file renamed over the old one.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A change to the cluster file reaches both doors with no restart: a new
// deny entry refuses the node at the next Enroll and the next CONNECT, and
// only that node; a forced reload (the daemons' SIGHUP) of a file that does
// not parse leaves both deciding as before, and both running.
func TestClusterFileReloadReachesBothDoors(t *testing.T) {
	dir := t.TempDir()
	prod := verifiertest.Issuer(t, kubeissuer.Options{})
	entry := verifiertest.ClusterEntry(t, prod, dir, "prod")
	file := func(deny string) string {
		s := "clusters:\n" + entry
		if deny != "" {
			s += "    deny: { nodes: [" + deny + "] }\n"
		}
		return s
	}
	path := filepath.Join(dir, "clusters.yaml")
	replace(t, path, file(""))
	d := startDaemons(t, path, daemonOpts{poll: 20 * time.Millisecond})

	const node, other = "ip-10-0-1-5.ec2.internal", "ip-10-0-1-6.ec2.internal"
	token := func(n string) string {
		tok, err := prod.Token(kubeissuer.Pod{NodeName: n}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if err := d.enroll(t, token(node)); err != nil {
		t.Fatalf("Enroll before the deny entry: %v", err)
	}
	if err := d.connectNATS(t, token(node)); err != nil {
		t.Fatalf("CONNECT before the deny entry: %v", err)
	}

	const applied = `msg="clusterfile: cluster file applied"`
	replace(t, path, file(node))
	waitLogged(t, d.serverLog, applied, 1)
	waitLogged(t, d.calloutLog, applied, 1)
	if err := d.enroll(t, token(node)); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Enroll of the denied node: %v, want Unauthenticated", err)
	}
	if err := d.connectNATS(t, token(node)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("CONNECT of the denied node: %v, want %v", err, nats.ErrAuthorization)
	}
	if err := d.enroll(t, token(other)); err != nil {
		t.Fatalf("Enroll of another node: %v", err)
	}
	if err := d.connectNATS(t, token(other)); err != nil {
		t.Fatalf("CONNECT of another node: %v", err)
	}
	wantRule := "node " + node + " is in deny.nodes"
	waitLogged(t, d.serverLog, wantRule, 1)
	waitLogged(t, d.calloutLog, wantRule, 1)

	const refused = `msg="clusterfile: new cluster file refused; the clusters in force stay in force"`
	replace(t, path, "clusters: [")
	waitLogged(t, d.serverLog, refused, 1)
	waitLogged(t, d.calloutLog, refused, 1)
	for _, hup := range []chan<- os.Signal{d.serverHUP, d.calloutHUP} {
		select {
		case hup <- os.Interrupt: // any value: the channel stands for SIGHUP
		case <-time.After(waitFor):
			t.Fatal("a daemon does not take its reload signal")
		}
	}
	waitLogged(t, d.serverLog, refused, 2)
	waitLogged(t, d.calloutLog, refused, 2)
	d.running(t)
	if err := d.enroll(t, token(node)); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Enroll of the denied node after a refused file: %v", err)
	}
	if err := d.connectNATS(t, token(node)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("CONNECT of the denied node after a refused file: %v", err)
	}
	if err := d.enroll(t, token(other)); err != nil {
		t.Fatal(err)
	}
	if err := d.connectNATS(t, token(other)); err != nil {
		t.Fatal(err)
	}
	d.running(t)
}
