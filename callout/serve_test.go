package callout_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

func writeSeed(t *testing.T, dir, name string, kp nkeys.KeyPair) string {
	t.Helper()
	seed, _ := kp.Seed()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Serve against an embedded nats-server in server-config mode with xkey: a
// Runner connects, the metrics show the decision and the cluster, and
// cancelling drains and returns.
func TestServeServesRunnersAndMetrics(t *testing.T) {
	dir := t.TempDir()
	is := testkeys.Issuer(t)
	clusters := prodClusterFile(t, dir, is)
	issuer, _ := nkeys.CreateAccount()
	issuerPub, _ := issuer.PublicKey()
	xk, _ := nkeys.CreateCurveKeys()
	xkPub, _ := xk.PublicKey()
	ns := natsembed.Serve(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
accounts {
  CALLOUT { users: [ { user: callout, password: pw } ] }
  RUNNERS {}
}
authorization { auth_callout { issuer: %s, account: CALLOUT, auth_users: [ callout ], xkey: %s } }
`, issuerPub, xkPub), nil)

	logs := &testlog.Buffer{}
	var addr string // set before ready is closed
	ready := make(chan struct{})
	cfg := callout.ServeConfig{
		NATSURLs: ns.ClientURL(), NATSUser: "callout", NATSPassword: "pw", NoKick: true,
		Mode:           callout.ModeServerConfig,
		IssuerSeedFile: writeSeed(t, dir, "issuer.nk", issuer),
		XKeySeedFile:   writeSeed(t, dir, "xkey.nk", xk),
		Account:        "RUNNERS", RunnerClusters: clusters,
		MetricsAddr: "127.0.0.1:0", Connections: 2,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Ready:  func(a string) { addr = a; close(ready) },
	}
	s := startServing(cfg)
	defer s.cancel()
	s.waitReady(t, ready, 10*time.Second, logs)
	if code, _ := get(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}

	// The first token may arrive before the background key fetch: the
	// kid-miss fetch then loads the keys inside the request.
	tok, err := is.Token(kubeissuer.Pod{NodeName: "node-1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.Token(tok))
	if err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	nc.Close()
	// Ready once it can authorize: the Runner's connect has loaded prod's keys.
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	// A reconnect with the same token is answered from the verified-token cache.
	nc, err = nats.Connect(ns.ClientURL(), nats.Token(tok))
	if err != nil {
		t.Fatalf("runner reconnect: %v", err)
	}
	nc.Close()
	if _, err := nats.Connect(ns.ClientURL(), nats.Token("not-a-token")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("bad token: %v", err)
	}
	_, body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{
		`compass_callout_decisions_total{outcome="authorized"} 2`,
		`compass_callout_decisions_total{outcome="denied"} 1`,
		`compass_cluster_keys{cluster="prod"} 1`,
		`compass_cluster_keys_usable{cluster="prod",reason=""} 1`,
		`compass_cluster_key_fetch_failing{cluster="prod"} 0`,
		`compass_build_info{goversion="go`,
		`compass_callout_in_flight 0`,
		"\ncompass_callout_nats_lag_seconds ",
		`compass_callout_decision_seconds_count 3`,
		`compass_callout_answer_slack_seconds_count 3`,
		`compass_verifier_cache_lookups_total{result="hit"} 1`,
		`compass_verifier_cache_lookups_total{result="miss"} 1`,
		`compass_callout_answers_past_horizon_total 0`,
		`compass_cluster_keyset_age_seconds{cluster="prod"}`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if !strings.Contains(body, "\ncompass_cluster_file_reload_failing 0\n") {
		t.Fatalf("/metrics lacks the cluster file's metrics:\n%s", body)
	}
	// The lag gauge reads the responder's lanes: a round trip is never 0.
	var lag float64
	if i := strings.Index(body, "\ncompass_callout_nats_lag_seconds "); i < 0 {
		t.Fatal("no lag gauge")
	} else if _, err := fmt.Sscan(body[i+len("\ncompass_callout_nats_lag_seconds "):], &lag); err != nil || lag <= 0 {
		t.Fatalf("compass_callout_nats_lag_seconds = %v (%v), want > 0", lag, err)
	}
	// The start-up record says what the callout runs with.
	recs, err := logs.JSONRecords("compass-callout answering")
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d start-up records (%v):\n%s", len(recs), err, logs)
	}
	answering := recs[0]
	got := fmt.Sprint(answering["mode"], answering["connections"], answering["xkey"], answering["clusters"],
		answering["minted_tokens"], time.Duration(answering["max_user_jwt_lifetime"].(float64)), answering["metrics_addr"])
	if want := fmt.Sprint("server-config", 2, true, "prod", false, callout.DefaultMaxLifetime, addr); got != want {
		t.Fatalf("start-up record: %s, want %s", got, want)
	}
	if strings.Contains(logs.String(), waitingForNATS) {
		t.Fatalf("logged %q with NATS up:\n%s", waitingForNATS, logs)
	}
	if strings.Contains(logs.String(), "callout: metrics server") {
		t.Fatalf("the metrics server logged an error:\n%s", logs)
	}
	if strings.Contains(logs.String(), tok) || strings.Contains(logs.String(), "not-a-token") {
		t.Fatal("a token reached the log")
	}
	seed, _ := issuer.Seed()
	if strings.Contains(logs.String(), string(seed)) {
		t.Fatal("the issuer seed reached the log")
	}

	s.stop(t)
	if strings.Contains(logs.String(), "callout: metrics server") {
		t.Fatalf("the metrics server logged an error when it was shut down:\n%s", logs)
	}
}

// The start-up guard compass-server has: with a cluster registered, a live
// minted Runner token whose ID contains "/" stops compass-callout before it
// connects, and says which rows; without clusters it is no obstacle.
func TestServeRefusesReservedRunnerIDs(t *testing.T) {
	dir := t.TempDir()
	dbURL := "sqlite://" + filepath.Join(dir, "compass.db")
	st, err := store.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	storetest.InsertLegacyRunnerToken(t, dbURL, "prod/node-1", false)
	is := testkeys.Issuer(t)
	clusters := prodClusterFile(t, dir, is)
	issuer, _ := nkeys.CreateAccount()
	cfg := callout.ServeConfig{
		// Nothing listens here: the guard must stop Serve before NATS.
		NATSURLs: "nats://127.0.0.1:1", Mode: callout.ModeServerConfig, Account: "RUNNERS", NoKick: true,
		IssuerSeedFile: writeSeed(t, dir, "issuer.nk", issuer),
		RunnerClusters: clusters, DatabaseURL: dbURL,
	}
	err = callout.Serve(t.Context(), cfg)
	if !errors.Is(err, verifier.ErrReservedRunnerIDs) {
		t.Fatalf("Serve = %v, want verifier.ErrReservedRunnerIDs", err)
	}
	// Without clusters the guard does not apply: Serve gets as far as NATS.
	cfg.RunnerClusters = ""
	if err := serveUntilWaitingForNATS(t, cfg); err == nil || !strings.Contains(err.Error(), "callout: NATS connection 0") {
		t.Fatalf("Serve without clusters = %v, want the NATS connection error", err)
	}
}

// compass-callout reads the store and never creates or migrates it: a
// missing database stops it with the store's reason, and nothing is created.
func TestServeNeverCreatesOrMigratesTheStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "compass.db")
	issuer, _ := nkeys.CreateAccount()
	cfg := callout.ServeConfig{
		NATSURLs: "nats://127.0.0.1:1", Mode: callout.ModeServerConfig, Account: "RUNNERS", NoKick: true,
		IssuerSeedFile: writeSeed(t, dir, "issuer.nk", issuer), DatabaseURL: "sqlite://" + path,
	}
	err := callout.Serve(t.Context(), cfg)
	if !errors.Is(err, store.ErrNoDatabase) || !strings.HasPrefix(err.Error(), "callout: --database-url: ") {
		t.Fatalf("Serve with no database = %v, want store.ErrNoDatabase", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the database file exists after Serve: %v", err)
	}
	// Once migrated, Serve gets as far as NATS.
	if _, err := store.Migrate(t.Context(), "sqlite://"+path); err != nil {
		t.Fatal(err)
	}
	if err := serveUntilWaitingForNATS(t, cfg); err == nil || !strings.Contains(err.Error(), "callout: NATS connection 0") {
		t.Fatalf("Serve on a migrated store = %v, want the NATS connection error", err)
	}
}

// The in-flight gauge reads the running responder: while a Runner's CONNECT
// waits on a key fetch (its key was rotated in, an unknown kid), /metrics
// counts it; once answered, it is 0 again.
func TestServeCountsRequestsInFlight(t *testing.T) {
	var fetches atomic.Int64
	entered := make(chan struct{}, 1) // a fetch after the start-up one is being held
	release := make(chan struct{})
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/jwks") && fetches.Add(1) > 1 {
				entered <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}
			next.ServeHTTP(w, r)
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer is.Close()
	run := startCallout(t, is, "")
	inFlight := func() string {
		t.Helper()
		_, body := get(t, "http://"+run.metrics+"/metrics")
		for line := range strings.Lines(body) {
			if strings.HasPrefix(line, "compass_callout_in_flight ") {
				return strings.TrimSpace(line)
			}
		}
		t.Fatalf("/metrics has no in-flight gauge:\n%s", body)
		return ""
	}
	if ev := run.nextLoad(t); ev.Err != nil { // the start-up fetch
		t.Fatalf("start-up key load: %v", ev.Err)
	}
	if _, err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	tok, err := is.Token(kubeissuer.Pod{NodeName: "node-1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan error, 1)
	go func() {
		nc, err := nats.Connect(run.natsURL, nats.Token(tok))
		if err == nil {
			nc.Close()
		}
		connected <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the unknown kid never fetched")
	}
	if got := inFlight(); got != "compass_callout_in_flight 1" {
		close(release)
		t.Fatalf("while a CONNECT waits on its key fetch: %s, want 1", got)
	}
	close(release)
	select {
	case err := <-connected:
		if err != nil {
			t.Fatalf("runner connect once the keys arrived: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connect never ended")
	}
	// The answer is published before the request stops counting.
	testutil.Eventually(t, 10*time.Second, "compass_callout_in_flight 0 after the answer", func() bool { return inFlight() == "compass_callout_in_flight 0" })
}
