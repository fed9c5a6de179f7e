package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// run runs compass-server's Main with args and an environment.
func run(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = server.Main(t.Context(), args, func(k string) string { return env[k] }, &o, &e)
	return code, o.String(), e.String()
}

func openStore(t *testing.T, dir string) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// DL-440 W2: minting a Runner token for "a/b" fails ("/" is reserved for
// Kubernetes Runner IDs), through the store and through the CLI.
func TestMintRunnerTokenWithSlashFails(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := run(t, nil, "mint-runner-token", "--runner-id", "a/b", "--data-dir", dir)
	if code != 2 || stdout != "" || !strings.Contains(stderr, `"/" is reserved`) {
		t.Fatalf("mint-runner-token a/b: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	st := openStore(t, dir)
	if _, _, err := st.Mint(t.Context(), verifier.SubjectRunner, "a/b"); !errors.Is(err, verifier.ErrInvalidArgument) {
		t.Fatalf("Mint(runner, a/b) = %v, want ErrInvalidArgument", err)
	}
	if infos, err := st.ListTokens(t.Context()); err != nil || len(infos) != 0 {
		t.Fatalf("tokens after refused mints: %v, %v", infos, err)
	}
	// An account name may contain "/": the reservation is for Runner IDs.
	if _, _, err := st.Mint(t.Context(), verifier.SubjectAccount, "team/a"); err != nil {
		t.Fatalf("Mint(account, team/a): %v", err)
	}
}

// DL-440 W2: storing a token that contains "." fails (it would be stored but
// never resolve: Resolve sends JWS-shaped tokens to Verify only).
func TestStoreTokenWithDotFails(t *testing.T) {
	st := openStore(t, t.TempDir())
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

// devTLS writes a dev CA's serving certificate and key, and the CA.
func devTLS(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	cert, caPEM, err := server.DevCA(time.Now())
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
	certFile = writeFile(t, filepath.Join(dir, "tls.crt"), chain.String())
	keyFile = writeFile(t, filepath.Join(dir, "tls.key"), string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	caFile = writeFile(t, filepath.Join(dir, "ca.pem"), string(caPEM))
	return
}

// serveUntilReady runs Serve and returns once it is ready (or failed).
func serveUntilReady(t *testing.T, cfg server.ServeConfig) (server.ServeInfo, <-chan error, context.CancelFunc) {
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

// DL-440 W2: with clusters configured, serve refuses to start while a live
// Runner token row has "/"; without clusters, or once the row is revoked, it starts.
func TestServeRefusesSlashRunnerTokens(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := devTLS(t, dir)
	clusters := writeFile(t, filepath.Join(dir, "clusters.yaml"),
		"clusters:\n  - name: prod\n    issuer: https://issuer.invalid\n")
	_ = openStore(t, dir) // migrate
	insertSlashRow(t, dir, "legacy/node-1", false)
	insertSlashRow(t, dir, "legacy/node-2", true)
	base := server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir}

	cfg := base
	cfg.RunnerClusters = clusters
	_, done, cancel := serveUntilReady(t, cfg)
	err := <-done
	cancel()
	if !errors.Is(err, server.ErrSlashRunnerTokens) || !strings.Contains(err.Error(), "1 such token") {
		t.Fatalf("Serve with clusters and a live \"/\" Runner token = %v, want ErrSlashRunnerTokens naming 1 token", err)
	}
	// Through the CLI too: exit code 1 and the reason.
	code, _, stderr := run(t, nil, "serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile,
		"--data-dir", dir, "--runner-clusters", clusters)
	if code != 1 || !strings.Contains(stderr, "revoke them") {
		t.Fatalf("serve: code %d, stderr %q", code, stderr)
	}

	// Without clusters the row is harmless: serve starts.
	si, done, cancel := serveUntilReady(t, base)
	if si.DoorAddr == "" {
		t.Fatalf("Serve without clusters did not start: %v", <-done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after a graceful stop", err)
	}

	// Revoke the row: serve starts with clusters.
	st := openStore(t, dir)
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
	si, done, cancel = serveUntilReady(t, cfg)
	if si.DoorAddr == "" {
		t.Fatalf("Serve with only revoked \"/\" rows did not start: %v", <-done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Minting prints the token once, alone on stdout; list-tokens never prints a
// token or a hash.
func TestMintPrintsTokenOnceOnStdout(t *testing.T) {
	dir := migrated(t)
	code, stdout, stderr := run(t, nil, "mint-account-token", "--name", "ops", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-account-token: code %d, stderr %q", code, stderr)
	}
	tok := strings.TrimSuffix(stdout, "\n")
	if tok == "" || strings.ContainsAny(tok, " \n\t.") || stdout != tok+"\n" {
		t.Fatalf("stdout is not the token alone on one line")
	}
	if strings.Contains(stderr, tok) {
		t.Fatal("the token also went to stderr")
	}
	st := openStore(t, dir)
	subj, err := verifier.NewResolver(nil, st).Resolve(t.Context(), tok, verifier.SubjectAccount)
	if err != nil || subj.ID != "ops" {
		t.Fatalf("the printed token resolves to %+v, %v", subj, err)
	}
	code, stdout, _ = run(t, nil, "mint-runner-token", "--runner-id", "build-01", "--data-dir", dir)
	if code != 0 {
		t.Fatal("mint-runner-token failed")
	}
	rtok := strings.TrimSpace(stdout)
	code, list, _ := run(t, nil, "list-tokens", "--data-dir", dir)
	if code != 0 {
		t.Fatal("list-tokens failed")
	}
	for _, secret := range []string{tok, rtok} {
		h := verifier.HashToken(secret)
		if strings.Contains(list, secret) || strings.Contains(list, hex.EncodeToString(h[:])) || strings.Contains(list, hex.EncodeToString(h[:8])) {
			t.Fatal("list-tokens printed a token or its hash")
		}
	}
	infos, _ := st.ListTokens(t.Context())
	if len(infos) != 2 || !strings.Contains(list, infos[0].ID) || !strings.Contains(list, "build-01") || !strings.Contains(list, "ops") {
		t.Fatalf("list-tokens:\n%s", list)
	}
	// revoke-token by public ID; the token stops resolving.
	if code, _, stderr := run(t, nil, "revoke-token", infos[0].ID, "--data-dir", dir); code != 0 {
		t.Fatalf("revoke-token: %s", stderr)
	}
	if _, err := verifier.NewResolver(nil, st).Resolve(t.Context(), tok, verifier.SubjectAccount); !errors.Is(err, verifier.ErrTokenNotFound) {
		t.Fatalf("a revoked token resolves: %v", err)
	}
}

// Flags first, then COMPASS_* environment variables.
func TestFlagsThenEnv(t *testing.T) {
	envDir, flagDir := migrated(t), migrated(t)
	env := map[string]string{"COMPASS_DATA_DIR": envDir}
	if code, _, stderr := run(t, env, "mint-runner-token", "--runner-id", "from-env"); code != 0 {
		t.Fatal(stderr)
	}
	if code, _, stderr := run(t, env, "mint-runner-token", "--runner-id", "from-flag", "--data-dir", flagDir); code != 0 {
		t.Fatal(stderr)
	}
	// COMPASS_RUNNER_ID stands in for --runner-id.
	if code, _, stderr := run(t, map[string]string{"COMPASS_DATA_DIR": envDir, "COMPASS_RUNNER_ID": "id-from-env"}, "mint-runner-token"); code != 0 {
		t.Fatal(stderr)
	}
	subjectsIn := func(dir string) []string {
		var ids []string
		infos, err := openStore(t, dir).ListTokens(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range infos {
			ids = append(ids, i.SubjectID)
		}
		return ids
	}
	if got := fmt.Sprint(subjectsIn(envDir)); got != "[from-env id-from-env]" {
		t.Fatalf("env data dir holds %s", got)
	}
	if got := fmt.Sprint(subjectsIn(flagDir)); got != "[from-flag]" {
		t.Fatalf("flag data dir holds %s", got)
	}
}

// Every command explains itself with --help; bad usage exits 2.
func TestHelpAndUsage(t *testing.T) {
	for _, cmd := range []string{"serve", "dev", "migrate", "backup", "mint-runner-token", "mint-account-token", "revoke-token", "list-tokens", "runners", "ping-runner"} {
		code, stdout, _ := run(t, nil, cmd, "--help")
		if code != 0 || !strings.Contains(stdout, "Usage: compass-server "+cmd) || !strings.Contains(stdout, "(env COMPASS_") {
			t.Fatalf("%s --help: code %d:\n%s", cmd, code, stdout)
		}
	}
	if code, stdout, _ := run(t, nil, "--help"); code != 0 || !strings.Contains(stdout, "ping-runner") {
		t.Fatalf("--help: %d %s", code, stdout)
	}
	for _, args := range [][]string{{}, {"nope"}, {"mint-runner-token"}, {"revoke-token"}, {"list-tokens", "extra"}, {"serve", "--bogus"}, {"migrate", "extra"}, {"backup"}} {
		if code, _, _ := run(t, nil, args...); code != 2 {
			t.Fatalf("%q: code %d, want 2", args, code)
		}
	}
	// The door is TLS only: serve without a certificate refuses to start.
	if code, _, stderr := run(t, nil, "serve", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(stderr, "TLS only") {
		t.Fatalf("serve without TLS: %d %s", code, stderr)
	}
}

func startNATS(t *testing.T) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return ns
}

// eventually polls cond until it holds or the deadline passes; used only
// where another goroutine's asynchronous write must be observed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serve end to end: a minted Runner enrolls over TLS, ping-runner goes
// through the admin door and NATS, Runner events keep last_seen, metrics are
// served, and the Server stops gracefully.
func TestServeEnrollPingLastSeen(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caFile := devTLS(t, dir)
	ns := startNATS(t)
	st := openStore(t, dir)
	rtok, _, err := st.Mint(t.Context(), verifier.SubjectRunner, "build-01")
	if err != nil {
		t.Fatal(err)
	}
	atok, _, err := st.Mint(t.Context(), verifier.SubjectAccount, "ops")
	if err != nil {
		t.Fatal(err)
	}
	prod, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close() })
	dark, err := kubeissuer.New(kubeissuer.Options{Wrap: func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) })
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dark.Close() })
	prodCA, err := prod.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	darkCA, err := dark.WriteCAFileIn(dir, "dark")
	if err != nil {
		t.Fatal(err)
	}
	si, done, cancel := serveUntilReady(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir,
		Clusters: []verifier.RunnerCluster{
			{Name: "prod", Issuer: prod.URL(), CAFile: prodCA},
			{Name: "dark", Issuer: dark.URL(), CAFile: darkCA},
		},
		NATS: server.NATSConfig{URL: ns.ClientURL()}, RunnerNATSURL: "tls://runners.example:4222", MetricsAddr: "127.0.0.1:0",
	})
	if si.DoorAddr == "" {
		t.Fatalf("Serve: %v", <-done)
	}
	doorURL := "https://" + si.DoorAddr
	hc, err := server.DoorClient(doorURL, caFile)
	if err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&runnerv1.EnrollRequest{Version: "v9.9.9-test", Hostname: "build-host-01"})
	req.Header().Set("Authorization", "Bearer "+rtok)
	res, err := runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC()).Enroll(t.Context(), req)
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if res.Msg.GetRunnerId() != "build-01" || res.Msg.GetNatsUrl() != "tls://runners.example:4222" || res.Msg.GetServerVersion() != server.Version {
		t.Fatalf("EnrollResponse = %v", res.Msg)
	}
	// A projected token from the registered cluster enrolls as <cluster>/<node>.
	ptok, err := prod.Token(kubeissuer.Pod{NodeName: "node-a.example"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	req = connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+ptok)
	if res, err := runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC()).Enroll(t.Context(), req); err != nil || res.Msg.GetRunnerId() != "prod/node-a_example" {
		t.Fatalf("Enroll(projected) = %v, %v", res, err)
	}

	// The door negotiates HTTP/2 over TLS (gRPC needs it).
	hres, err := hc.Get(doorURL + "/")
	if err != nil {
		t.Fatal(err)
	}
	hres.Body.Close()
	if hres.ProtoMajor != 2 || hres.TLS == nil {
		t.Fatalf("door answered over %s (TLS %v), want HTTP/2 over TLS", hres.Proto, hres.TLS != nil)
	}

	// A stand-in Runner on NATS: answers ping, publishes an event.
	rc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	var pings atomic.Int64
	if _, err := rc.Subscribe("compass.runner.build-01.cmd", func(m *nats.Msg) {
		pings.Add(1)
		_ = m.Respond([]byte(`{"ok":true,"result":{"pong":true}}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"COMPASS_TOKEN": atok}
	code, stdout, stderr := run(t, env, "ping-runner", "build-01", "--server", doorURL, "--ca-file", caFile)
	if code != 0 || !strings.Contains(stdout, `"pong":true`) || !strings.Contains(stdout, "rtt: ") || pings.Load() != 1 {
		t.Fatalf("ping-runner: code %d stdout %q stderr %q pings %d", code, stdout, stderr, pings.Load())
	}
	// A Runner token does not open the admin door.
	code, _, stderr = run(t, map[string]string{"COMPASS_TOKEN": rtok}, "ping-runner", "build-01", "--server", doorURL, "--ca-file", caFile)
	if code != 1 || !strings.Contains(stderr, "unauthenticated") || strings.Contains(stderr, rtok) {
		t.Fatalf("ping-runner with a Runner token: code %d stderr %q", code, stderr)
	}
	// Not connected: a clear error.
	code, _, stderr = run(t, env, "ping-runner", "nobody", "--server", doorURL, "--ca-file", caFile)
	if code != 1 || !strings.Contains(stderr, "not connected") {
		t.Fatalf("ping-runner nobody: code %d stderr %q", code, stderr)
	}

	r, err := st.GetRunner(t.Context(), "build-01")
	if err != nil || !r.LastSeenAt.IsZero() {
		t.Fatalf("before any event: %+v, %v", r, err)
	}
	if err := rc.Publish("compass.runner.build-01.evt.heartbeat", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "last_seen from the heartbeat", func() bool {
		r, err := st.GetRunner(t.Context(), "build-01")
		return err == nil && !r.LastSeenAt.IsZero()
	})

	// runners, from the store and through the door.
	for _, args := range [][]string{{"runners", "--data-dir", dir}, {"runners", "--server", doorURL, "--ca-file", caFile}} {
		code, stdout, stderr := run(t, env, args...)
		// The minted Runner's row, with what it reported of itself.
		if code != 0 || !strings.Contains(stdout, "build-01") || !strings.Contains(stdout, "minted") ||
			!strings.Contains(stdout, "v9.9.9-test") || !strings.Contains(stdout, "build-host-01") {
			t.Fatalf("%q: code %d stdout %q stderr %q", args, code, stdout, stderr)
		}
	}

	// Metrics.
	scrape := func() string {
		t.Helper()
		mres, err := http.Get("http://" + si.MetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer mres.Body.Close()
		body, _ := io.ReadAll(mres.Body)
		return string(body)
	}
	body := scrape()
	if !strings.Contains(body, `compass_cluster_keys_usable{cluster="prod",reason=""} 1`) ||
		!regexp.MustCompile(`(?m)^compass_cluster_keys_usable\{cluster="dark",reason="[^"]+"\} 0$`).MatchString(body) ||
		!regexp.MustCompile(`(?m)^compass_cluster_keyset_age_seconds\{cluster="dark"\} [0-9.e+-]+$`).MatchString(body) ||
		!strings.Contains(body, `compass_cluster_keys{cluster="prod"} 1`) ||
		!regexp.MustCompile(`(?m)^compass_verifier_cache_lookups_total\{result="miss"\} [1-9][0-9]*$`).MatchString(body) ||
		!strings.Contains(body, `compass_build_info{goversion="`) {
		t.Fatalf("cluster metrics:\n%s", body)
	}
	if !strings.Contains(string(body), `compass_door_auth_total{code="ok",want="runner"} 2`) ||
		!strings.Contains(string(body), `compass_door_auth_total{code="unauthenticated",want="account"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("graceful stop: %v", err)
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

// lockedWriter collects output written from another goroutine.
type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve picks up a renewed certificate pair without a restart (checked at
// most every CertCheckEvery), and keeps the last good pair when a new one
// does not load.
func TestServeReloadsRenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caA := devTLS(t, dir)
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	si, done, cancel := serveUntilReady(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, Now: now})
	if si.DoorAddr == "" {
		t.Fatalf("Serve: %v", <-done)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(readTrim(t, caA)))
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
	c2, k2, caB := devTLS(t, renewed)
	pool.AppendCertsFromPEM([]byte(readTrim(t, caB)))
	later := time.Now().Add(time.Hour)
	for src, dst := range map[string]string{c2: certFile, k2: keyFile} {
		writeFile(t, dst, readTrim(t, src)+"\n")
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
