// Package servertest runs the Server for the tests of the server package and
// of compass-server's commands: a TLS pair signed by a throwaway CA, the
// store in a directory, and Serve until it is ready.
package servertest

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/doorhttp"
	"github.com/compass-runner/identity/internal/lib/loopbackca"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
)

// TLS writes into dir a serving certificate chain for loopback (tls.crt),
// its key (tls.key) and the throwaway CA that signed it (ca.pem).
func TLS(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	caPEM, _ := writePair(t, certFile, keyFile, time.Now())
	caFile = writeFile(t, filepath.Join(dir, "ca.pem"), string(caPEM))
	return certFile, keyFile, caFile
}

// Pair writes over certFile and keyFile a serving pair for loopback made as
// of at by a throwaway CA (loopbackca.New), and returns the serving
// certificate.
func Pair(t *testing.T, certFile, keyFile string, at time.Time) *x509.Certificate {
	t.Helper()
	_, leaf := writePair(t, certFile, keyFile, at)
	return leaf
}

// writePair writes a pair as Pair does and returns its CA's PEM and the
// serving certificate.
func writePair(t *testing.T, certFile, keyFile string, at time.Time) ([]byte, *x509.Certificate) {
	t.Helper()
	cert, caPEM, err := loopbackca.New(at)
	if err != nil {
		t.Fatal(err)
	}
	var chain bytes.Buffer
	for _, der := range cert.Certificate {
		_ = pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, certFile, chain.String())
	writeFile(t, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return caPEM, leaf
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// OpenStore opens the SQLite database in dir, creating and migrating it,
// and closes it when t ends.
func OpenStore(t *testing.T, dir string) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// Serve runs server.Serve with cfg and returns once it is ready, with the
// channel its error arrives on and what stops it. When Serve fails before it
// is ready, the ServeInfo is empty and the channel holds the error.
func Serve(t *testing.T, cfg server.ServeConfig) (server.ServeInfo, <-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan server.ServeInfo, 1)
	cfg.Ready = func(_ context.Context, si server.ServeInfo) error {
		ready <- si
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- server.Serve(ctx, cfg) }()
	select {
	case si := <-ready:
		return si, done, cancel
	case err := <-done:
		cancel()
		errc := make(chan error, 1)
		errc <- err
		return server.ServeInfo{}, errc, cancel
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("Serve neither became ready nor failed")
	}
	return server.ServeInfo{}, nil, cancel
}

// Running is Serve for a configuration that must start: a Serve that fails
// before it is ready fails the test with its error.
func Running(t *testing.T, cfg server.ServeConfig) (server.ServeInfo, <-chan error, context.CancelFunc) {
	t.Helper()
	si, done, cancel := Serve(t, cfg)
	if si.DoorAddr == "" {
		t.Fatalf("Serve: %v", <-done)
	}
	return si, done, cancel
}

// Stop cancels a Serve that Running started and fails the test unless it
// returns nil: the graceful stop a SIGTERM makes.
func Stop(t *testing.T, done <-chan error, cancel context.CancelFunc) {
	t.Helper()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after a graceful stop: %v", err)
	}
}

// DoorClient is the door's URL at si and the client the Runners and the
// admin commands use (internal/lib/doorhttp), trusting only the system roots
// and caFile.
func DoorClient(t *testing.T, si server.ServeInfo, caFile string) (string, *http.Client) {
	t.Helper()
	doorURL := "https://" + si.DoorAddr
	hc, err := doorhttp.Client(doorURL, caFile)
	if err != nil {
		t.Fatal(err)
	}
	return doorURL, hc
}

// SlashRunnerTokenDir prepares dir for a Serve that DL-440 W2's start-up
// guard must refuse: a TLS pair, a cluster file registering one cluster
// (whose issuer is never reached) and a migrated store holding a live
// minted Runner token whose ID, id, contains "/", as a workload Runner's
// does. It returns the certificate, its key and the cluster file.
func SlashRunnerTokenDir(t *testing.T, dir, id string) (certFile, keyFile, clusters string) {
	t.Helper()
	certFile, keyFile, _ = TLS(t, dir)
	clusters = writeFile(t, filepath.Join(dir, "clusters.yaml"),
		"clusters:\n  - name: prod\n    issuer: https://issuer.invalid\n")
	_ = OpenStore(t, dir) // migrate
	storetest.InsertLegacyRunnerToken(t, "sqlite://"+filepath.Join(dir, "compass.db"), id, false)
	return certFile, keyFile, clusters
}
