package server_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/compass-runner/identity/internal/lib/doorhttp"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
)

// healthWait bounds each wait for /readyz to follow a change in NATS or the
// store, which the Server's checks see asynchronously.
const healthWait = 10 * time.Second

// get returns the status code and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode, string(b)
}

// doorHealth asks the door's grpc.health.v1 for the whole Server's status.
func doorHealth(t *testing.T, doorURL, caFile string) grpchealth.Status {
	t.Helper()
	hc, err := doorhttp.Client(doorURL, caFile)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grpchealth.NewClient(hc, doorURL, connect.WithGRPC()).Check(t.Context(), &grpchealth.CheckRequest{})
	if err != nil {
		t.Fatalf("Health/Check: %v", err)
	}
	return res.Status
}

// The door's certificate is part of readiness: once the files hold a pair
// that has expired (the reloader loads it, as it loads any pair that
// parses), /readyz says so. (The door's own health cannot be asked then: the
// handshake refuses the certificate.)
func TestReadyzCertificateExpired(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	start := time.Now()
	servertest.Pair(t, certFile, keyFile, start)
	clock := testutil.NewClock(start)
	si, done, cancel := servertest.Running(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, MetricsAddr: "127.0.0.1:0", Now: clock.Now,
	})
	base := "http://" + si.MetricsAddr
	if code, body := get(t, base+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz = %d %q, want 200 ready", code, body)
	}
	expired := servertest.Pair(t, certFile, keyFile, start.Add(-72*time.Hour))
	later := start.Add(time.Hour)
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, later, later); err != nil { // a modification the reloader sees
			t.Fatal(err)
		}
	}
	clock.Advance(server.CertCheckEvery + time.Second)
	want := fmt.Sprintf("tls: the door's certificate expired at %s\n", expired.NotAfter.UTC().Format(time.RFC3339))
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || body != want {
		t.Fatalf("/readyz with an expired certificate = %d %q, want 503 %q", code, body, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
}
