package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/internal/testlog"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/test/natsembed"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfigFlagsThenEnv(t *testing.T) {
	e := map[string]string{
		"COMPASS_NATS_URL":            "nats://from-env:4222",
		"COMPASS_ISSUER_SEED_FILE":    "/env/issuer.nk",
		"COMPASS_ACCOUNT":             "RUNNERS",
		"COMPASS_RUNNER_CLUSTERS":     "/env/clusters.yaml",
		"COMPASS_CALLOUT_CONNECTIONS": "8",
		"COMPASS_NATS_PASSWORD":       "pw",
	}
	c, err := parseConfig([]string{"--nats-url", "nats://flag:4222", "--nats-user", "callout"}, env(e), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.NATSURLs != "nats://flag:4222" {
		t.Fatalf("flag lost to env: %s", c.NATSURLs)
	}
	if c.IssuerSeedFile != "/env/issuer.nk" || c.Account != "RUNNERS" || c.Connections != 8 || c.NATSPassword != "pw" {
		t.Fatalf("env not applied: %+v", c)
	}
	if c.MaxUserLifetime != 10*time.Minute || c.Mode != "server-config" {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestParseConfigRefusals(t *testing.T) {
	base := []string{"--issuer-seed-file", "x", "--runner-clusters", "c"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no issuer", []string{"--account", "A", "--runner-clusters", "c"}, nil, "--issuer-seed-file is required"},
		{"no account in server-config mode", base, nil, "--account"},
		{"operator without user signer", append(base, "--mode", "operator"), nil, "--user-signing-seed-file is required"},
		{"bad mode", append(base, "--mode", "x", "--account", "A"), nil, "--mode"},
		{"two credentials", append(base, "--account", "A", "--nats-creds", "a", "--nats-nkey", "b"), nil, "one of"},
		{"user without password", append(base, "--account", "A", "--nats-user", "u"), nil, "COMPASS_NATS_PASSWORD"},
		{"password twice", append(base, "--account", "A", "--nats-user", "u", "--nats-password-file", "/nonexistent"), map[string]string{"COMPASS_NATS_PASSWORD": "p"}, "not both"},
		{"nothing to accept", []string{"--issuer-seed-file", "x", "--account", "A"}, nil, "nothing to accept"},
		{"too many connections", append(base, "--account", "A", "--connections", "1000"), nil, "--connections"},
		{"bad env value", append(base, "--account", "A"), map[string]string{"COMPASS_CALLOUT_WORKERS": "many"}, "COMPASS_CALLOUT_WORKERS"},
		{"stray argument", append(base, "--account", "A", "extra"), nil, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, env(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "compass-callout: ") {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestHelpNamesEveryFlagAndItsEnv(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, env(nil), &out); !errors.Is(err, errHelp) {
		t.Fatalf("err = %v", err)
	}
	for flag, ev := range envOf {
		if !strings.Contains(out.String(), "--"+flag) || !strings.Contains(out.String(), ev) {
			t.Fatalf("--help lacks --%s / %s", flag, ev)
		}
	}
}

func writeSeed(t *testing.T, dir, name string, kp nkeys.KeyPair) string {
	t.Helper()
	seed, _ := kp.Seed()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunServesRunnersAndMetrics runs the command's run against an embedded
// nats-server in server-config mode with xkey: a Runner connects, the metrics
// show the decision and the cluster, and cancelling drains and returns.
func TestRunServesRunnersAndMetrics(t *testing.T) {
	dir := t.TempDir()
	is, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer is.Close()
	ca, err := is.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	clusters := filepath.Join(dir, "clusters.yaml")
	if err := os.WriteFile(clusters, []byte(fmt.Sprintf("clusters:\n  - name: prod\n    issuer: %s\n    caFile: %s\n", is.URL(), ca)), 0o600); err != nil {
		t.Fatal(err)
	}
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

	args := []string{
		"--nats-url", ns.ClientURL(), "--nats-user", "callout",
		"--issuer-seed-file", writeSeed(t, dir, "issuer.nk", issuer),
		"--xkey-seed-file", writeSeed(t, dir, "xkey.nk", xk),
		"--account", "RUNNERS", "--runner-clusters", clusters,
		"--metrics-addr", "127.0.0.1:0", "--connections", "2",
	}
	pwFile := filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig(args, env(map[string]string{"COMPASS_NATS_PASSWORD_FILE": pwFile}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrCh := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, log, hooks{ready: func(a string) { addrCh <- a }}) }()
	var addr string
	select {
	case addr = <-addrCh:
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d", code)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
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
	if _, err := nats.Connect(ns.ClientURL(), nats.Token("not-a-token")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("bad token: %v", err)
	}
	_, body := get("/metrics")
	for _, want := range []string{
		`compass_callout_decisions_total{outcome="authorized"} 1`,
		`compass_callout_decisions_total{outcome="denied"} 1`,
		`compass_callout_cluster_keys{cluster="prod"} 1`,
		`compass_callout_cluster_fail_closed{cluster="prod",reason=""} 0`,
		`compass_callout_cluster_last_fetch_error{cluster="prod"} 0`,
		`compass_callout_in_flight 0`,
		`compass_callout_decision_seconds_count 2`,
		`compass_callout_answer_slack_seconds_count 2`,
		`compass_callout_cluster_keyset_age_seconds{cluster="prod"}`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(logs.String(), tok) || strings.Contains(logs.String(), "not-a-token") {
		t.Fatal("a token reached the log")
	}
	seed, _ := issuer.Seed()
	if strings.Contains(logs.String(), string(seed)) {
		t.Fatal("the issuer seed reached the log")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after drain: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
