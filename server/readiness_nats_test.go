package server_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/grpchealth"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// natsConnectedMetric reads compass_server_nats_connected from /metrics: the
// sample's value, or "" when the family is absent.
func natsConnectedMetric(t *testing.T, base string) string {
	t.Helper()
	_, body := get(t, base+"/metrics")
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), server.MetricNATSConnected+" "); ok {
			return v
		}
	}
	return ""
}

// A NATS outage is not a door outage: with the in-process nats-server
// stopped, /readyz stays 200 and the door's grpc.health.v1 SERVING (so no
// replica leaves its Service), a Runner with a minted token still enrolls
// through the real door, and NATS's state is reported apart: /healthz (still
// 200, liveness) carries "nats: not connected (RECONNECTING)" and
// compass_server_nats_connected is 0. NATS back on its port turns both back.
// The store closed then makes /readyz 503 with the store's line alone.
func TestReadyzFollowsTheDoorNotNATS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caFile := servertest.TLS(t, dir)
	ns := natsembed.Serve(t, `listen: "127.0.0.1:-1"`, nil)
	port := ns.Addr().(*net.TCPAddr).Port
	si, done, cancel := servertest.Running(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir,
		NATS: server.NATSConfig{URL: ns.ClientURL()}, MetricsAddr: "127.0.0.1:0",
	})
	base, doorURL := "http://"+si.MetricsAddr, "https://"+si.DoorAddr
	healthz := func() (int, string) { t.Helper(); return get(t, base+"/healthz") }
	readyz := func() (int, string) { t.Helper(); return get(t, base+"/readyz") }

	// The NATS connection is made in the background.
	testutil.Eventually(t, healthWait, "NATS connected", func() bool { return natsConnectedMetric(t, base) == "1" })
	if code, body := healthz(); code != http.StatusOK || body != "ok\nnats: connected\n" {
		t.Fatalf("/healthz = %d %q, want 200 with nats: connected", code, body)
	}
	if code, body := readyz(); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz = %d %q, want 200 ready", code, body)
	}

	ns.Shutdown()
	testutil.Eventually(t, healthWait, "NATS reported down", func() bool { return natsConnectedMetric(t, base) == "0" })
	if code, body := healthz(); code != http.StatusOK || body != "ok\nnats: not connected (RECONNECTING)\n" {
		t.Fatalf("/healthz with NATS down = %d %q, want 200 with the NATS line", code, body)
	}
	if code, body := readyz(); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz with NATS down = %d %q, want 200 ready", code, body)
	}
	if st := doorHealth(t, doorURL, caFile); st != grpchealth.StatusServing {
		t.Fatalf("door health with NATS down = %s, want serving", st)
	}
	// And the door does what readiness promises: a Runner enrolls.
	token, _, err := si.Store.Mint(t.Context(), verifier.SubjectRunner, "no-nats-runner")
	if err != nil {
		t.Fatal(err)
	}
	e, err := enroll.New(enroll.Config{ServerURL: doorURL, CAFile: caFile, Tokens: runner.StaticToken(token),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Enroll(t.Context(), runner.EnrollRequest{Version: "test", Hostname: "h"})
	if err != nil || res.RunnerID != "no-nats-runner" {
		t.Fatalf("Enroll with NATS down = %+v, %v; want runner no-nats-runner", res, err)
	}

	// NATS back on its port: the connection and its reports come back.
	ns = natsembed.Serve(t, fmt.Sprintf(`listen: "127.0.0.1:%d"`, port), nil)
	testutil.Eventually(t, healthWait, "NATS back", func() bool { return natsConnectedMetric(t, base) == "1" })
	if code, body := healthz(); code != http.StatusOK || body != "ok\nnats: connected\n" {
		t.Fatalf("/healthz with NATS back = %d %q", code, body)
	}

	// The store is the door's: closed, /readyz is 503 with its line only
	// (NATS up or down alike), and the door's health NOT_SERVING.
	if err := si.Store.Close(); err != nil {
		t.Fatal(err)
	}
	want := "store: the sqlite database does not answer: store: schema version: sql: database is closed\n"
	if code, body := readyz(); code != http.StatusServiceUnavailable || body != want {
		t.Fatalf("/readyz with the store closed = %d %q, want 503 %q", code, body, want)
	}
	ns.Shutdown()
	testutil.Eventually(t, healthWait, "NATS down again", func() bool { return natsConnectedMetric(t, base) == "0" })
	if code, body := readyz(); code != http.StatusServiceUnavailable || body != want {
		t.Fatalf("/readyz with the store closed and NATS down = %d %q, want 503 %q", code, body, want)
	}
	if st := doorHealth(t, doorURL, caFile); st != grpchealth.StatusNotServing {
		t.Fatalf("door health with the store closed = %s, want not_serving", st)
	}
	if code, _ := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz with the store closed = %d, want 200 (liveness)", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// Without --nats-url there is no NATS to report: /healthz is "ok" alone and
// the metric is absent, not a 0 that would page someone.
func TestHealthzWithoutNATSHasNoNATSLine(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := servertest.TLS(t, dir)
	si, done, cancel := servertest.Running(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, MetricsAddr: "127.0.0.1:0",
	})
	base := "http://" + si.MetricsAddr
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q, want 200 ok", code, body)
	}
	if v := natsConnectedMetric(t, base); v != "" {
		t.Fatalf("%s = %s without --nats-url, want absent", server.MetricNATSConnected, v)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
}
