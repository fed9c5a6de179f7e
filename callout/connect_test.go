package callout_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// waitingForNATS is the callout's log line while no NATS server is up.
const waitingForNATS = "callout: no NATS server reachable yet; retrying in the background until one is"

// logWatch is a log writer that keeps everything written and closes seen
// once n lines containing want were written.
type logWatch struct {
	testlog.Buffer
	want string
	n    int
	seen chan struct{}
	mu   sync.Mutex
	got  int
}

func newLogWatch(want string) *logWatch { return newLogWatchN(want, 1) }

func newLogWatchN(want string, n int) *logWatch {
	return &logWatch{want: want, n: n, seen: make(chan struct{})}
}

func (w *logWatch) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if c := bytes.Count(p, []byte(w.want)); c > 0 {
		w.mu.Lock()
		before := w.got
		w.got += c
		if before < w.n && w.got >= w.n {
			close(w.seen)
		}
		w.mu.Unlock()
	}
	return n, err
}

// serveUntilWaitingForNATS runs Serve against a NATS URL where nothing
// listens, stops it once it says it is waiting for NATS, and returns Serve's
// error: a start-up test's proof that Serve got as far as NATS.
func serveUntilWaitingForNATS(t *testing.T, cfg callout.ServeConfig) error {
	t.Helper()
	w := newLogWatch(waitingForNATS)
	cfg.Logger = slog.New(slog.NewTextHandler(w, nil))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- callout.Serve(ctx, cfg) }()
	select {
	case <-w.seen:
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after cancel")
		}
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("Serve neither returned nor waited for NATS:\n%s", w.String())
	}
	return nil
}

// calloutKeys is what a server-config callout and its nats-servers share:
// the cluster file of a local issuer, the issuer account and the xkey.
type calloutKeys struct {
	dir                  string
	issuer               *kubeissuer.Issuer
	clusters             string
	signer, xkey         nkeys.KeyPair
	signerPub, xkeyPub   string
	signerFile, xkeyFile string
}

func newCalloutKeys(t *testing.T) *calloutKeys {
	t.Helper()
	k := &calloutKeys{dir: t.TempDir()}
	k.issuer = testkeys.Issuer(t)
	k.clusters = prodClusterFile(t, k.dir, k.issuer)
	k.signer, _ = nkeys.CreateAccount()
	k.signerPub, _ = k.signer.PublicKey()
	k.xkey, _ = nkeys.CreateCurveKeys()
	k.xkeyPub, _ = k.xkey.PublicKey()
	k.signerFile = writeSeed(t, k.dir, "issuer.nk", k.signer)
	k.xkeyFile = writeSeed(t, k.dir, "xkey.nk", k.xkey)
	return k
}

// prodClusterFile writes dir/clusters.yaml, registering is as the one
// cluster prod (trusting only its CA, written into dir), and returns its path.
func prodClusterFile(t *testing.T, dir string, is *kubeissuer.Issuer) string {
	t.Helper()
	return verifiertest.ClusterFile(t, dir, verifiertest.ClusterEntry(t, is, dir, "prod"))
}

// conf is a server-config nats-server configuration listening on listen.
func (k *calloutKeys) conf(listen string) string {
	return fmt.Sprintf(`
listen: %q
accounts {
  CALLOUT { users: [ { user: callout, password: pw } ] }
  RUNNERS {}
}
authorization { auth_callout { issuer: %s, account: CALLOUT, auth_users: [ callout ], xkey: %s } }
`, listen, k.signerPub, k.xkeyPub)
}

func (k *calloutKeys) serveConfig(urls string, conns int) callout.ServeConfig {
	return callout.ServeConfig{
		NATSURLs: urls, NATSUser: "callout", NATSPassword: "pw",
		Mode: callout.ModeServerConfig, IssuerSeedFile: k.signerFile, XKeySeedFile: k.xkeyFile,
		Account: "RUNNERS", RunnerClusters: k.clusters, Connections: conns, NoKick: true,
	}
}

// runnerConnects connects to url with a fresh projected token, through the
// callout, and closes the connection.
func (k *calloutKeys) runnerConnects(t *testing.T, url, node string) {
	t.Helper()
	tok, err := k.issuer.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.Token(tok))
	if err != nil {
		t.Fatalf("runner %s at %s: %v", node, url, err)
	}
	nc.Close()
}

// serveCallout runs Serve until the test ends and returns once Ready was
// called; the callout's log is in the returned buffer.
func serveCallout(t *testing.T, cfg callout.ServeConfig) *testlog.Buffer {
	t.Helper()
	logs := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ready := make(chan struct{})
	cfg.Ready = func(string) { close(ready) }
	s := startServing(cfg)
	t.Cleanup(func() { s.stop(t) })
	s.waitReady(t, ready, 15*time.Second, logs)
	return logs
}

// serving is callout.Serve running on a goroutine of the test's.
type serving struct {
	cancel context.CancelFunc
	done   chan error
}

// startServing runs Serve with cfg until stop or cancel.
func startServing(cfg callout.ServeConfig) *serving {
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- callout.Serve(ctx, cfg) }()
	return s
}

// waitReady waits for ready; Serve returning first, or timeout passing,
// fails the test with the log so far.
func (s *serving) waitReady(t *testing.T, ready <-chan struct{}, timeout time.Duration, logs fmt.Stringer) {
	t.Helper()
	select {
	case <-ready:
	case err := <-s.done:
		t.Fatalf("Serve: %v\n%s", err, logs)
	case <-time.After(timeout):
		t.Fatalf("callout not ready within %v:\n%s", timeout, logs)
	}
}

// stop cancels Serve and fails the test unless Serve drains and returns nil
// within 15 s.
func (s *serving) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("Serve after drain: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

// compass-callout started before NATS keeps retrying instead of exiting,
// says so once, and answers CONNECTs as soon as the server comes up.
func TestServeWaitsForNATS(t *testing.T) {
	k := newCalloutKeys(t)
	addr := testutil.FreeAddr(t)
	w := newLogWatch(waitingForNATS)
	cfg := k.serveConfig("nats://"+addr, 2)
	cfg.Logger = slog.New(slog.NewTextHandler(w, nil))
	metricsAddr := testutil.FreeAddr(t)
	cfg.MetricsAddr = metricsAddr
	ready := make(chan struct{})
	cfg.Ready = func(string) { close(ready) }
	s := startServing(cfg)
	defer s.cancel()

	select {
	case <-w.seen:
	case err := <-s.done:
		t.Fatalf("Serve returned before NATS was up: %v\n%s", err, w.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("no waiting log line:\n%s", w.String())
	}
	select {
	case <-ready:
		t.Fatal("ready before any NATS server was up")
	default:
	}
	if got := strings.Count(w.String(), waitingForNATS); got != 1 {
		t.Fatalf("the waiting line was logged %d times, want once:\n%s", got, w.String())
	}
	if !strings.Contains(w.String(), "connections_waiting=2 urls=nats://"+addr) {
		t.Fatalf("the waiting line does not say which URLs and how many connections:\n%s", w.String())
	}
	// Alive while it waits (a liveness probe must not restart it), and not
	// ready, saying why.
	if code, body := get(t, "http://"+metricsAddr+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz while waiting for NATS: %d %q", code, body)
	}
	if code, body := get(t, "http://"+metricsAddr+"/readyz"); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "nats: not connected yet (waiting for a server)") {
		t.Fatalf("/readyz while waiting for NATS: %d %q", code, body)
	}

	ns := natsembed.Serve(t, k.conf(addr), nil)
	s.waitReady(t, ready, 15*time.Second, w)
	if got := calloutClients(t, ns); got != 2 {
		t.Fatalf("%d callout connections on the server, want 2", got)
	}
	k.runnerConnects(t, ns.ClientURL(), "node-1")
	if !strings.Contains(w.String(), `msg="callout: NATS connected" connection=0 url=nats://`+addr) {
		t.Fatalf("no connected line:\n%s", w.String())
	}

	s.stop(t)
}

// The waiting line names the NATS URLs without the password a URL may carry
// (natsurl.Redact): the log is read by more people than the Secret is.
func TestServeWaitingForNATSLineRedactsThePassword(t *testing.T) {
	k := newCalloutKeys(t)
	addr := testutil.FreeAddr(t)
	const password = "s3cr3t-callout-pw"
	w := newLogWatch(waitingForNATS)
	cfg := k.serveConfig("nats://compass-callout:"+password+"@"+addr, 1)
	cfg.Logger = slog.New(slog.NewTextHandler(w, nil))
	s := startServing(cfg)
	defer s.cancel()
	select {
	case <-w.seen:
	case err := <-s.done:
		t.Fatalf("Serve returned before NATS was up: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no waiting log line within 10 s")
	}
	if strings.Contains(w.String(), password) {
		t.Fatal("the log holds the URL's password")
	}
	if !strings.Contains(w.String(), "urls=nats://compass-callout:xxxxx@"+addr) {
		t.Fatalf("the waiting line does not name the URL with its password redacted:\n%s", strings.ReplaceAll(w.String(), password, "<password>"))
	}
}

// get fetches url and returns the status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// Stopped while it waits for NATS, Serve returns at once and says so.
func TestServeStoppedWhileWaitingForNATS(t *testing.T) {
	k := newCalloutKeys(t)
	cfg := k.serveConfig("nats://"+testutil.FreeAddr(t), 3)
	err := serveUntilWaitingForNATS(t, cfg)
	want := "callout: NATS connection 0: stopped before any NATS server was reachable: context canceled"
	if err == nil || err.Error() != want || !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve = %v, want %s", err, want)
	}
}

// calloutClients counts the compass-callout connections on ns.
func calloutClients(t *testing.T, ns *server.Server) int {
	t.Helper()
	return natsembed.ClientsNamed(t, ns, "compass-callout")
}

// Given several URLs, the callout's connections start on them in turn
// (connection i at URL i mod len), so each server carries its share and any
// one of them answers its own Runners.
func TestServeSpreadsConnectionsOverURLs(t *testing.T) {
	k := newCalloutKeys(t)
	var servers []*server.Server
	var urls []string
	for range 3 {
		ns := natsembed.Serve(t, k.conf("127.0.0.1:-1"), nil)
		servers = append(servers, ns)
		urls = append(urls, ns.ClientURL())
	}
	// Spaces and an empty entry are read as nats.go reads them.
	serveCallout(t, k.serveConfig(strings.Join(urls, " , ")+",", 6))
	for i, ns := range servers {
		if got := calloutClients(t, ns); got != 2 {
			t.Errorf("server %d has %d callout connections, want 2 of 6", i, got)
		}
		k.runnerConnects(t, ns.ClientURL(), fmt.Sprintf("node-%d", i))
	}
}

// An empty URL list is refused with the flag's name.
func TestServeRefusesNoNATSURL(t *testing.T) {
	k := newCalloutKeys(t)
	err := callout.Serve(t.Context(), k.serveConfig(" , ", 1))
	want := "--nats-url: no NATS URL"
	if err == nil || err.Error() != want || !errors.Is(err, callout.ErrConfig) {
		t.Fatalf("Serve = %v, want %s", err, want)
	}
}

// Given one node's URL, compass-callout learns the cluster's other node from
// INFO; when its node goes, its connections reconnect there and it answers
// that node's Runners.
func TestServeReconnectsToALearnedNode(t *testing.T) {
	k := newCalloutKeys(t)
	withCluster := func(routes string) string {
		return k.conf("127.0.0.1:-1") + fmt.Sprintf("cluster { name: compass, listen: \"127.0.0.1:-1\" %s }\n", routes)
	}
	a := natsembed.Serve(t, withCluster(""), nil)
	b := natsembed.Serve(t, withCluster(fmt.Sprintf(`, routes: [ "nats://127.0.0.1:%d" ]`, a.ClusterAddr().Port)), nil)
	bAddr := strings.TrimPrefix(b.ClientURL(), "nats://")
	// Both connections say so once they are back, on b.
	w := newLogWatchN(`msg="callout: NATS reconnected" connection=`, 2)
	cfg := k.serveConfig(a.ClientURL(), 2)
	cfg.Logger = slog.New(slog.NewTextHandler(w, nil))
	ready := make(chan struct{})
	cfg.Ready = func(string) { close(ready) }
	s := startServing(cfg)
	defer s.cancel()
	s.waitReady(t, ready, 15*time.Second, w)
	if got := calloutClients(t, b); got != 0 {
		t.Fatalf("%d callout connections on b before a went, want 0", got)
	}
	a.Shutdown()
	select {
	case <-w.seen:
	case <-time.After(15 * time.Second):
		t.Fatalf("the connections never reconnected:\n%s", w.String())
	}
	for i := range 2 {
		if want := fmt.Sprintf(`msg="callout: NATS reconnected" connection=%d url=nats://%s`, i, bAddr); !strings.Contains(w.String(), want) {
			t.Fatalf("connection %d did not reconnect to b:\n%s", i, w.String())
		}
	}
	if got := calloutClients(t, b); got != 2 {
		t.Fatalf("%d callout connections on b, want 2", got)
	}
	for i := range 2 {
		if want := fmt.Sprintf(`msg="callout: NATS disconnected; reconnecting" connection=%d error=`, i); !strings.Contains(w.String(), want) {
			t.Fatalf("connection %d did not log its disconnect with the cause:\n%s", i, w.String())
		}
	}
	// nats.go resends the subscriptions as it reconnects, but b registers
	// them on its own goroutines, which expose no event: polled, bounded.
	acc, err := b.LookupAccount("CALLOUT")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "b to have both callout subscriptions", func() bool { return acc.Interest(callout.Subject) >= 2 })
	k.runnerConnects(t, b.ClientURL(), "node-b")
	s.stop(t)
}

// A --nats-nkey file that cannot be read stops Serve with the flag's name.
func TestServeRefusesAnUnreadableNkeyFile(t *testing.T) {
	k := newCalloutKeys(t)
	cfg := k.serveConfig("nats://127.0.0.1:1", 1)
	cfg.NATSUser, cfg.NATSPassword = "", ""
	cfg.NATSNkeyFile = filepath.Join(t.TempDir(), "missing.nk")
	err := callout.Serve(t.Context(), cfg)
	if err == nil || !strings.HasPrefix(err.Error(), "callout: --nats-nkey: ") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Serve = %v, want the --nats-nkey file refused", err)
	}
}

// In operator mode an unreadable --user-signing-seed-file stops Serve before
// it connects, with the flag's name.
func TestServeRefusesAnUnreadableUserSigningSeed(t *testing.T) {
	k := newCalloutKeys(t)
	cfg := k.serveConfig("nats://127.0.0.1:1", 1)
	cfg.Mode, cfg.Account = callout.ModeOperator, ""
	cfg.UserSeedFile = filepath.Join(t.TempDir(), "missing.nk")
	err := callout.Serve(t.Context(), cfg)
	if err == nil || !strings.HasPrefix(err.Error(), "callout: --user-signing-seed-file: ") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Serve = %v, want the --user-signing-seed-file refused", err)
	}
}
