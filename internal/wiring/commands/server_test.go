package commands_test

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// Every command explains itself with --help; bad usage exits 2.
func TestHelpAndUsage(t *testing.T) {
	for _, cmd := range []string{"serve", "dev", "migrate", "backup", "mint-runner-token", "mint-account-token", "revoke-token", "clear-quarantine", "list-tokens", "runners", "ping-runner"} {
		code, stdout, _ := runServer(t, nil, cmd, "--help")
		if code != 0 || !strings.Contains(stdout, "Usage: compass-server "+cmd) || !strings.Contains(stdout, "(env COMPASS_") {
			t.Fatalf("%s --help: code %d:\n%s", cmd, code, stdout)
		}
	}
	if code, stdout, _ := runServer(t, nil, "--help"); code != 0 || !strings.Contains(stdout, "ping-runner") {
		t.Fatalf("--help: %d %s", code, stdout)
	}
	for _, args := range [][]string{{}, {"nope"}, {"mint-runner-token"}, {"revoke-token"}, {"clear-quarantine"}, {"list-tokens", "extra"}, {"serve", "--bogus"}, {"migrate", "extra"}, {"backup"}} {
		if code, _, _ := runServer(t, nil, args...); code != 2 {
			t.Fatalf("%q: code %d, want 2", args, code)
		}
	}
	// The door is TLS only: serve without a certificate refuses to start.
	if code, _, stderr := runServer(t, nil, "serve", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(stderr, "TLS only") {
		t.Fatalf("serve without TLS: %d %s", code, stderr)
	}
}

// serve end to end: a minted Runner enrolls over TLS, ping-runner goes
// through the admin door and NATS, Runner events keep last_seen, metrics are
// served, and the Server stops gracefully.
func TestServeEnrollPingLastSeen(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caFile := servertest.TLS(t, dir)
	ns := natsembed.Plain(t)
	st := servertest.OpenStore(t, dir)
	rtok, _, err := st.Mint(t.Context(), verifier.SubjectRunner, "build-01")
	if err != nil {
		t.Fatal(err)
	}
	atok, _, err := st.Mint(t.Context(), verifier.SubjectAccount, "ops")
	if err != nil {
		t.Fatal(err)
	}
	prod := verifiertest.Issuer(t, kubeissuer.Options{})
	dark := verifiertest.Issuer(t, kubeissuer.Options{Wrap: func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) })
	}})
	si, done, cancel := servertest.Running(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir,
		Clusters: []verifier.RunnerCluster{
			verifiertest.ClusterIn(t, prod, dir, "prod"),
			verifiertest.ClusterIn(t, dark, dir, "dark"),
		},
		NATS: server.NATSConfig{URL: ns.ClientURL()}, RunnerNATSURL: "tls://runners.example:4222", MetricsAddr: "127.0.0.1:0",
	})
	doorURL, hc := servertest.DoorClient(t, si, caFile)
	req := connect.NewRequest(&runnerv1.EnrollRequest{Version: "v9.9.9-test", Hostname: "build-host-01"})
	req.Header().Set("Authorization", "Bearer "+rtok)
	res, err := runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC()).Enroll(t.Context(), req)
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if res.Msg.GetRunnerId() != "build-01" || res.Msg.GetNatsUrl() != "tls://runners.example:4222" || res.Msg.GetServerVersion() != cli.BuildInfo().Version {
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
	code, stdout, stderr := runServer(t, env, "ping-runner", "build-01", "--server", doorURL, "--ca-file", caFile)
	if code != 0 || !strings.Contains(stdout, `"pong":true`) || !strings.Contains(stdout, "rtt: ") || pings.Load() != 1 {
		t.Fatalf("ping-runner: code %d stdout %q stderr %q pings %d", code, stdout, stderr, pings.Load())
	}
	// A Runner token does not open the admin door.
	code, _, stderr = runServer(t, map[string]string{"COMPASS_TOKEN": rtok}, "ping-runner", "build-01", "--server", doorURL, "--ca-file", caFile)
	if code != 1 || !strings.Contains(stderr, "unauthenticated") || strings.Contains(stderr, rtok) {
		t.Fatalf("ping-runner with a Runner token: code %d stderr %q", code, stderr)
	}
	// Not connected: a clear error.
	code, _, stderr = runServer(t, env, "ping-runner", "nobody", "--server", doorURL, "--ca-file", caFile)
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
	testutil.Eventually(t, 10*time.Second, "last_seen from the heartbeat", func() bool {
		r, err := st.GetRunner(t.Context(), "build-01")
		return err == nil && !r.LastSeenAt.IsZero()
	})

	// runners, from the store and through the door.
	for _, args := range [][]string{{"runners", "--data-dir", dir}, {"runners", "--server", doorURL, "--ca-file", caFile}} {
		code, stdout, stderr := runServer(t, env, args...)
		// The minted Runner's row, with what it reported of itself.
		if code != 0 || !strings.Contains(stdout, "build-01") || !strings.Contains(stdout, "minted") ||
			!strings.Contains(stdout, "v9.9.9-test") || !strings.Contains(stdout, "build-host-01") {
			t.Fatalf("%q: code %d stdout %q stderr %q", args, code, stdout, stderr)
		}
		// --output json: the same Runners in the documented schema, from
		// the store and through the door's ListRunners alike.
		code, stdout, stderr = runServer(t, env, append(args, "--output", "json")...)
		if code != 0 {
			t.Fatalf("%q --output json: code %d stderr %q", args, code, stderr)
		}
		byID := map[string]map[string]any{}
		for _, r := range decodeList(t, stdout, "runners", runnerKeys) {
			byID[r["id"].(string)] = r
		}
		m, p := byID["build-01"], byID["prod/node-a_example"]
		if len(byID) != 2 || m["method"] != "minted" || m["version"] != "v9.9.9-test" || m["hostname"] != "build-host-01" ||
			m["cluster"] != nil || m["last_seen_at"] == nil || p["method"] != "projected" || p["cluster"] != "prod" ||
			p["node_name"] != "node-a.example" || p["last_seen_at"] != nil {
			t.Fatalf("%q --output json: %s", args, stdout)
		}
		for _, r := range byID {
			for _, k := range []string{"first_enrolled_at", "last_enrolled_at"} {
				if _, err := time.Parse(time.RFC3339, r[k].(string)); err != nil {
					t.Fatalf("%q --output json: %s: %v", args, k, err)
				}
			}
		}
	}

	// A quarantined Runner ID (DL-459), as compass-callout records one:
	// listed after the Runners, from the store and through the door alike.
	qw, err := store.OpenQuarantineWriter(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if err != nil {
		t.Fatal(err)
	}
	quarantinedAt := time.Date(2026, 12, 3, 12, 0, 5, 0, time.UTC)
	for i := range 2 {
		if _, _, err := qw.RecordDisplacement(t.Context(), store.Displacement{RunnerID: "prod/node-a_example",
			Newer: "10.0.0.2:40000", Older: "10.0.0.1:50000", At: quarantinedAt.Add(time.Duration(i-1) * time.Second)},
			store.QuarantinePolicy{After: 1, Window: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := qw.Close(); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{{"runners", "--data-dir", dir}, {"runners", "--server", doorURL, "--ca-file", caFile}} {
		code, stdout, stderr := runServer(t, env, args...)
		if code != 0 || !regexp.MustCompile(`(?m)^prod/node-a_example +2026-12-03T12:00:05Z +2 +10\.0\.0\.2:40000 +10\.0\.0\.1:50000$`).MatchString(stdout) {
			t.Fatalf("%q: code %d stderr %q; no quarantine row for prod/node-a_example in\n%s", args, code, stderr, stdout)
		}
		code, stdout, stderr = runServer(t, env, append(args, "--output", "json")...)
		var list map[string][]map[string]any
		if err := json.Unmarshal([]byte(stdout), &list); code != 0 || err != nil {
			t.Fatalf("%q --output json: code %d, %v, stderr %q", args, code, err, stderr)
		}
		want := map[string]any{"runner_id": "prod/node-a_example", "quarantined_at": "2026-12-03T12:00:05Z", "displacements": float64(2),
			"newer_client": "10.0.0.2:40000", "older_client": "10.0.0.1:50000"}
		if len(list) != 2 || len(list["runners"]) != 2 || len(list["quarantined"]) != 1 || !maps.Equal(list["quarantined"][0], want) {
			t.Fatalf("%q --output json: %v, want the two Runners and quarantined [%v]", args, list, want)
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

// DL-440 W2 through the command line: with clusters configured and a live
// Runner token row with "/", compass-server serve exits 1 with the reason
// (server.TestServeRefusesSlashRunnerTokens: Serve itself).
func TestServeCommandRefusesSlashRunnerTokens(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, clusters := servertest.SlashRunnerTokenDir(t, dir, "legacy/node-1")
	// Through the CLI too: exit code 1 and the reason.
	code, _, stderr := runServer(t, nil, "serve", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile,
		"--data-dir", dir, "--runner-clusters", clusters)
	if code != 1 || !strings.Contains(stderr, "revoke them") {
		t.Fatalf("serve: code %d, stderr %q", code, stderr)
	}
}

// An explicit --runner-nats-url with credentials is refused at start, naming
// the flag and not the credentials (server.TestServeRefusesNATSURLsThatWouldShowCredentials:
// a --nats-url that does not parse).
func TestServeCommandRefusesRunnerNATSURLWithCredentials(t *testing.T) {
	const secret = "n4ts-s3cret-do-not-show"
	for _, url := range []string{
		"tls://compass-server:" + secret + "@nats.example:4222",
		"tls://" + secret + "@nats.example:4222",
		"tls://a.example:4222, wss://" + secret + "@b.example:443",
	} {
		code, stdout, stderr := runServer(t, nil, "serve", "--data-dir", t.TempDir(), "--runner-nats-url", url)
		want := "compass-server: server: --runner-nats-url carries credentials"
		if code != 1 || !strings.HasPrefix(stderr, want) || strings.Contains(stdout+stderr, secret) {
			t.Errorf("serve --runner-nats-url %s: exit %d, stderr %q; want exit 1 and %q without the secret", url, code, stderr, want)
		}
	}
}
