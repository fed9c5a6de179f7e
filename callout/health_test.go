package callout_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// healthWait bounds every wait on the callout or a key load.
const healthWait = 10 * time.Second

// calloutRun is a callout.Serve against an in-process nats-server.
type calloutRun struct {
	natsURL string
	metrics string
	loads   chan verifier.LoadEvent
}

// startCallout runs callout.Serve with one cluster, prod, at is, and dbURL
// when set, until the test ends.
func startCallout(t *testing.T, is *kubeissuer.Issuer, dbURL string) *calloutRun {
	t.Helper()
	dir := t.TempDir()
	clusters := prodClusterFile(t, dir, is)
	ns := natsembed.ServeForProcess(t, dir)
	run := &calloutRun{natsURL: ns.URL, loads: make(chan verifier.LoadEvent, 16)}
	cfg := ns.ServeConfig()
	cfg.RunnerClusters, cfg.DatabaseURL, cfg.MetricsAddr, cfg.Connections = clusters, dbURL, "127.0.0.1:0", 1
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.LoadHook = func(e verifier.LoadEvent) { run.loads <- e }
	run.metrics = runServe(t, cfg)
	return run
}

// runServe runs callout.Serve with cfg until the test ends (its error, if
// any, fails the test then) and returns the metrics address once it answers.
func runServe(t *testing.T, cfg callout.ServeConfig) string {
	t.Helper()
	ready := make(chan string, 1)
	cfg.Ready = func(a string) { ready <- a }
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- callout.Serve(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("callout.Serve: %v", err)
		}
	})
	select {
	case addr := <-ready:
		return addr
	case err := <-done:
		t.Fatalf("callout.Serve: %v", err)
	case <-time.After(healthWait):
		t.Fatal("the callout did not become ready")
	}
	return ""
}

// nextLoad waits for the next key load of the cluster.
func (c *calloutRun) nextLoad(t *testing.T) verifier.LoadEvent {
	t.Helper()
	select {
	case e := <-c.loads:
		return e
	case <-time.After(healthWait):
		t.Fatal("no key load")
	}
	return verifier.LoadEvent{}
}

func (c *calloutRun) readyz(t *testing.T) (int, string) {
	t.Helper()
	return get(t, "http://"+c.metrics+"/readyz")
}

// A callout whose only cluster cannot fetch its keys, and with no store, can
// authorize nothing: /readyz is 503 and says why, though it is subscribed
// and connected. Once the JWKS answers and a Runner's token loads the keys,
// it is 200.
func TestReadyzNeedsUsableKeysOrStore(t *testing.T) {
	failing := testutil.NewFailingJWKS(true)
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Wrap: failing.Wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	c := startCallout(t, is, "")
	if e := c.nextLoad(t); e.Cluster != "prod" || e.Err == nil {
		t.Fatalf("first load = %+v, want prod failing", e)
	}
	want := fmt.Sprintf("clusters: no cluster has usable keys: prod: key set not loaded yet (last fetch: jwks: GET %s/openid/v1/jwks: status 503 Service Unavailable)\n", is.URL())
	if code, body := c.readyz(t); code != http.StatusServiceUnavailable || body != want {
		t.Fatalf("/readyz with prod's JWKS failing = %d %q, want 503 %q", code, body, want)
	}

	failing.SetFailing(false)
	// A Runner's token, of a kid the callout has not seen, fetches the keys
	// inside its request.
	tok, err := is.Token(kubeissuer.Pod{NodeName: "node-1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(c.natsURL, nats.Token(tok))
	if err != nil {
		t.Fatalf("Runner connect once the JWKS answers: %v", err)
	}
	nc.Close()
	if e := c.nextLoad(t); e.Cluster != "prod" || e.Err != nil || e.Keys != 1 {
		t.Fatalf("load once the JWKS answers = %+v, want prod with 1 key", e)
	}
	if code, body := c.readyz(t); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz with prod's keys loaded = %d %q, want 200 ready", code, body)
	}
}

// With --database-url the callout can authorize minted tokens while no
// cluster has keys: the store answering is enough to be ready.
func TestReadyzStoreAloneSuffices(t *testing.T) {
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Wrap: testutil.NewFailingJWKS(true).Wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "compass.db")
	if _, err := store.Migrate(t.Context(), dbURL); err != nil {
		t.Fatal(err)
	}
	c := startCallout(t, is, dbURL)
	if e := c.nextLoad(t); e.Err == nil {
		t.Fatalf("first load = %+v, want a failure", e)
	}
	if code, body := c.readyz(t); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz with the store and no keys = %d %q, want 200 ready", code, body)
	}
}
