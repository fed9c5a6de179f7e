package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// DL-440 W2: storing a token that contains "." fails (it would be stored but
// never resolve: Resolve sends JWS-shaped tokens to Verify only).
func TestStoreTokenWithDotFails(t *testing.T) {
	st := servertest.OpenStore(t, t.TempDir())
	good, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{good[:20] + "." + good[20:], good + ".x.y", "." + good} {
		_, err := st.StoreTokenHash(t.Context(), tok, verifier.SubjectRunner, "r1")
		if !errors.Is(err, verifier.ErrInvalidArgument) {
			t.Fatalf("StoreTokenHash(token with \".\") = %v, want ErrInvalidArgument", err)
		}
		if strings.Contains(err.Error(), tok) || strings.Contains(err.Error(), good) {
			t.Fatal("the error quotes the token")
		}
	}
	if infos, _ := st.ListTokens(t.Context()); len(infos) != 0 {
		t.Fatalf("a token with \".\" was stored: %v", infos)
	}
	if _, err := st.StoreTokenHash(t.Context(), good, verifier.SubjectRunner, "r1"); err != nil {
		t.Fatalf("StoreTokenHash(plain token): %v", err)
	}
}

// insertSlashRow writes a Runner token row whose ID has "/", as a row minted
// before "/" was reserved would be (the API refuses to write one).
func insertSlashRow(t *testing.T, dir, id string, revoked bool) {
	t.Helper()
	storetest.InsertLegacyRunnerToken(t, "sqlite://"+filepath.Join(dir, "compass.db"), id, revoked)
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// DL-440 W2: with clusters configured, serve refuses to start while a live
// Runner token row has "/"; without clusters, or once the row is revoked, it
// starts. (internal/wiring/commands.TestServeCommandRefusesSlashRunnerTokens: the
// command's exit code and message.)
func TestServeRefusesSlashRunnerTokens(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, clusters := servertest.SlashRunnerTokenDir(t, dir, "legacy/node-1")
	insertSlashRow(t, dir, "legacy/node-2", true)
	base := server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir}

	cfg := base
	cfg.RunnerClusters = clusters
	_, done, cancel := servertest.Serve(t, cfg)
	err := <-done
	cancel()
	if !errors.Is(err, server.ErrSlashRunnerTokens) || !strings.Contains(err.Error(), "1 such token") {
		t.Fatalf("Serve with clusters and a live \"/\" Runner token = %v, want ErrSlashRunnerTokens naming 1 token", err)
	}
	// Without clusters the row is harmless: serve starts.
	si, done, cancel := servertest.Serve(t, base)
	if si.DoorAddr == "" {
		t.Fatalf("Serve without clusters did not start: %v", <-done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after a graceful stop", err)
	}

	// Revoke the row: serve starts with clusters.
	st := servertest.OpenStore(t, dir)
	infos, err := st.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		if !i.Revoked() {
			if _, err := st.Revoke(t.Context(), i.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	si, done, cancel = servertest.Serve(t, cfg)
	if si.DoorAddr == "" {
		t.Fatalf("Serve with only revoked \"/\" rows did not start: %v", <-done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// fakeToucher counts last_seen writes.
type fakeToucher struct {
	mu     sync.Mutex
	writes map[string]int
	err    error
}

func (f *fakeToucher) TouchRunner(_ context.Context, id string, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.writes[id]++
	return nil
}

// last_seen is written at most once per TouchEvery per Runner, and retried
// on the next event after a failed write.
func TestLastSeenWritesAtMostEveryTouchEvery(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	ft := &fakeToucher{writes: map[string]int{}}
	ls := server.NewLastSeen(ft, clock, slogDiscard())
	ctx := t.Context()
	steps := []struct {
		advance time.Duration
		subject string
		wrote   bool
	}{
		{0, "compass.runner.r1.evt.heartbeat", true},
		{time.Second, "compass.runner.r1.evt.heartbeat", false},
		{0, "compass.runner.r2.evt.container.started", true},
		{server.TouchEvery - time.Second, "compass.runner.r1.evt.x", true},
		{0, "compass.runner.r1.evt.x", false},
		{0, "not.a.runner.subject", false},
		{0, "compass.runner", false},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		if got := ls.Seen(ctx, s.subject); got != s.wrote {
			t.Fatalf("step %d (%s): wrote = %v, want %v", i, s.subject, got, s.wrote)
		}
	}
	if ft.writes["r1"] != 2 || ft.writes["r2"] != 1 {
		t.Fatalf("writes = %v", ft.writes)
	}
	ft.err = errors.New("database down")
	now = now.Add(server.TouchEvery)
	if ls.Seen(ctx, "compass.runner.r1.evt.x") {
		t.Fatal("a failed write reported success")
	}
	ft.err = nil
	if !ls.Seen(ctx, "compass.runner.r1.evt.x") {
		t.Fatal("the write after a failure was rate-limited")
	}
	// A Runner that never enrolled is not an error, and not retried at once.
	ft.err = fmt.Errorf("wrapped: %w", store.ErrNotFound)
	for i := range 2 {
		if ls.Seen(ctx, "compass.runner.ghost.evt.x") {
			t.Fatalf("event %d: ghost Runner written", i)
		}
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serve picks up a renewed certificate pair without a restart (checked at
// most every CertCheckEvery), and keeps the last good pair when a new one
// does not load.
func TestServeReloadsRenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caA := servertest.TLS(t, dir)
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	si, done, cancel := servertest.Running(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, Now: now})
	defer servertest.Stop(t, done, cancel)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(testutil.ReadTrim(t, caA)))
	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", si.DoorAddr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := served()

	// Renew: a new pair (and CA) over the same files, with a later mtime.
	renewed := t.TempDir()
	c2, k2, caB := servertest.TLS(t, renewed)
	pool.AppendCertsFromPEM([]byte(testutil.ReadTrim(t, caB)))
	later := time.Now().Add(time.Hour)
	for src, dst := range map[string]string{c2: certFile, k2: keyFile} {
		writeFile(t, dst, testutil.ReadTrim(t, src)+"\n")
		if err := os.Chtimes(dst, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if got := served(); got != first {
		t.Fatal("the pair was re-read before CertCheckEvery passed")
	}
	offset.Store(int64(server.CertCheckEvery))
	second := served()
	if second == first {
		t.Fatal("the renewed pair is not served")
	}
	// A broken pair keeps the last good one.
	writeFile(t, keyFile, "not a key\n")
	later = later.Add(time.Hour)
	if err := os.Chtimes(keyFile, later, later); err != nil {
		t.Fatal(err)
	}
	offset.Store(int64(2 * server.CertCheckEvery))
	if got := served(); got != second {
		t.Fatal("a broken pair replaced the good one")
	}
}
