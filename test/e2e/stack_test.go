// Package e2e runs compass-runner end to end on the embedded stack: an
// in-process nats-server with compass-callout in front of it (server-config
// mode with xkey), the Server's door over TLS on a SQLite store, and a local
// HTTPS issuer that writes and rotates projected token files.
package e2e

import (
	"context"
	"encoding/pem"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/door"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

const cluster = "e2e"

type stack struct {
	issuer   *kubeissuer.Issuer
	natsURL  string
	doorURL  string
	doorCA   string // PEM file of the door's certificate
	st       store.Store
	server   *nats.Conn // the Compass Server's NATS connection
	doorLogs *testlog.Buffer
}

type stackOpts struct {
	maxUserLifetime time.Duration
	issuerNow       func() time.Time
	alg             kubeissuer.Alg // RS256 when empty
}

func newStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	// callout.Responder.Start flushes under ctx, which nats.go requires to
	// carry a deadline; the deadline also ends the responder, so it is far.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	dir := t.TempDir()
	s := &stack{doorLogs: &testlog.Buffer{}}
	var err error
	if s.st, err = store.Open(ctx, "sqlite://"+filepath.Join(dir, "compass.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.st.Close() })
	if s.issuer, err = kubeissuer.New(kubeissuer.Options{Now: o.issuerNow, Alg: o.alg}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.issuer.Close() })
	ca, err := s.issuer.WriteCAFileIn(dir, cluster)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := s.st.BootstrapTenant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := verifier.New([]verifier.RunnerCluster{{Name: cluster, Issuer: s.issuer.URL(), CAFile: ca}}, verifier.WithTenant(tenant))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	resolver := verifier.NewResolver(v, s.st)

	// nats-server with an auth callout, xkey-sealed; the auth timeout of
	// deploy/nats.
	s.natsURL = natsembed.Start(t, natsembed.Config{
		Resolver: resolver, MaxLifetime: o.maxUserLifetime, ServerUser: true, AuthTimeout: 5,
	}).URL
	if s.server, err = nats.Connect(s.natsURL, nats.UserInfo(natsembed.ServerUser, natsembed.ServerPassword)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.server.Close)

	// The door over TLS; it tells Runners the NATS URL.
	h, err := door.NewHandler(door.Config{Resolver: resolver, Enroller: s.st, Runners: s.st,
		Requester: door.NATSRequester{Conn: s.server}, NATSURL: s.natsURL, ServerVersion: "e2e",
		Logger: slog.New(slog.NewTextHandler(s.doorLogs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.ServeTLS(t, h)
	s.doorURL = srv.URL
	s.doorCA = filepath.Join(dir, "door-ca.pem")
	if err := os.WriteFile(s.doorCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// tokenFile writes a projected token for node into a fresh directory.
func (s *stack) tokenFile(t *testing.T, node string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if _, err := s.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	return path
}

// runnerHandle is a Runner started the way cmd/compass-runner starts one:
// only a token file and the Server URL with its CA.
type runnerHandle struct {
	r        *runner.Runner
	tokens   *runner.FileToken
	logs     *testlog.Buffer
	ready    chan string
	finished chan struct{} // closed when Run returned; err is then set
	err      error
	cancel   context.CancelFunc
}

type runnerOpts struct {
	refresh      time.Duration
	checkEvery   time.Duration
	rotateJitter time.Duration
	onEvent      func(runner.LinkEvent)
	quiet        bool
	httpClient   *http.Client // shared door client (nil: the Runner builds its own from --ca-file)
}

func (s *stack) startRunner(t *testing.T, path string, o runnerOpts) *runnerHandle {
	t.Helper()
	h := &runnerHandle{logs: &testlog.Buffer{}, ready: make(chan string, 1), finished: make(chan struct{})}
	level := slog.LevelDebug
	if o.quiet {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: level}))
	h.tokens = runner.NewFileToken(path, log, nil)
	ec := enroll.Config{ServerURL: s.doorURL, CAFile: s.doorCA, Tokens: h.tokens, Logger: log}
	if o.httpClient != nil {
		ec.HTTPClient = o.httpClient
	}
	e, err := enroll.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	cfg := runner.Config{Version: "e2e", Hostname: "e2e-host", Tokens: h.tokens, TokenFile: path, Enroller: e,
		Heartbeat: -1, Logger: log,
		OnReady: func(id string) { h.ready <- id },
		Link: runner.LinkConfig{Refresh: o.refresh, CheckEvery: o.checkEvery, RotateJitter: o.rotateJitter,
			ReconnectWait: 100 * time.Millisecond, ReconnectJitter: 100 * time.Millisecond, MaxReconnectJitter: 400 * time.Millisecond, OnEvent: o.onEvent}}
	if h.r, err = runner.New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		h.err = h.r.Run(ctx)
		close(h.finished)
	}()
	t.Cleanup(func() { h.stop(t) })
	return h
}

func (h *runnerHandle) stop(t *testing.T) {
	t.Helper()
	h.cancel()
	select {
	case <-h.finished:
		if h.err != nil {
			t.Errorf("Runner.Run: %v", h.err)
		}
	case <-time.After(runner.DrainTimeout + 5*time.Second):
		t.Errorf("Runner did not stop")
	}
}

// waitReady returns the Server-assigned ID once the Runner is connected.
func (h *runnerHandle) waitReady(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case id := <-h.ready:
		return id
	case <-h.finished:
		t.Fatalf("Runner stopped before it was ready: %v\n%s", h.err, h.logs)
	case <-time.After(d):
		t.Fatalf("Runner not ready after %s:\n%s", d, h.logs)
	}
	return ""
}

// httpClientFor is an HTTP/2 client that trusts the door's certificate.
func httpClientFor(t *testing.T, s *stack) *http.Client {
	t.Helper()
	c, err := runner.DoorHTTPClient(s.doorURL, s.doorCA)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
