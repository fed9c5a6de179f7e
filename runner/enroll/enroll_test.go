package enroll_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/door"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

type env struct {
	prod, dark *kubeissuer.Issuer
	url        string
	client     *http.Client
	st         store.Store
}

// newEnv runs the real door over a SQLite store and two issuers: "prod"
// (healthy) and "dark" (its JWKS answers 503, so its tokens are Unavailable).
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{}
	dir := t.TempDir()
	var err error
	if e.st, err = store.Open(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.st.Close() })
	if e.prod, err = kubeissuer.New(kubeissuer.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.prod.Close() })
	e.dark, err = kubeissuer.New(kubeissuer.Options{Wrap: testutil.NewFailingJWKS(true).Wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.dark.Close() })
	prodCA, _ := e.prod.WriteCAFileIn(dir, "prod")
	darkCA, _ := e.dark.WriteCAFileIn(dir, "dark")
	tenant, err := e.st.BootstrapTenant(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	v, err := verifier.New([]verifier.RunnerCluster{
		{Name: "prod", Issuer: e.prod.URL(), CAFile: prodCA},
		{Name: "dark", Issuer: e.dark.URL(), CAFile: darkCA},
	}, verifier.WithTenant(tenant))
	if err != nil {
		t.Fatal(err)
	}
	_ = v.Refresh(t.Context()) // dark fails, by design
	h, err := door.NewHandler(door.Config{Resolver: verifier.NewResolver(v, e.st), Enroller: e.st, Runners: e.st,
		NATSURL: "nats://nats.example:4222", ServerVersion: "server-test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.ServeTLS(t, h)
	e.url, e.client = srv.URL, srv.Client()
	return e
}

func (e *env) tokenFile(t *testing.T, is *kubeissuer.Issuer, node string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if _, err := is.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	return path
}

func (e *env) newClient(t *testing.T, path string, retry runner.Retry) *enroll.Client {
	t.Helper()
	retry.Logger = slog.New(slog.DiscardHandler)
	c, err := enroll.New(enroll.Config{ServerURL: e.url, Tokens: runner.NewFileToken(path, slog.New(slog.DiscardHandler), nil),
		HTTPClient: e.client, Retry: retry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEnrollWithOnlyTokenFileGetsServerAssignedID(t *testing.T) {
	e := newEnv(t)
	c := e.newClient(t, e.tokenFile(t, e.prod, "ip-10-0-1-5.ec2.internal"), runner.Retry{})
	res, err := c.Enroll(t.Context(), runner.EnrollRequest{Version: "v-test", Hostname: "host"})
	if err != nil {
		t.Fatal(err)
	}
	want := runner.EnrollResult{RunnerID: "prod/ip-10-0-1-5_ec2_internal", ServerVersion: "server-test", NATSURL: "nats://nats.example:4222"}
	if res != want {
		t.Fatalf("Enroll = %+v, want %+v", res, want)
	}
	// And the Server recorded it under that ID.
	runners, err := e.st.ListRunners(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(runners) != 1 || runners[0].ID != want.RunnerID {
		t.Fatalf("store has %+v", runners)
	}
}

func TestEnrollWrongRunnerIDIsNotRetried(t *testing.T) {
	e := newEnv(t)
	attempts := 0
	c := e.newClient(t, e.tokenFile(t, e.prod, "node-a"), runner.Retry{After: func(time.Duration) <-chan time.Time {
		attempts++
		return time.After(0)
	}})
	_, err := c.Enroll(t.Context(), runner.EnrollRequest{RunnerID: "prod/node-b"})
	if connect.CodeOf(err) != connect.CodePermissionDenied || attempts != 0 {
		t.Fatalf("err = %v after %d retries, want PermissionDenied and no retry", err, attempts)
	}
}

func TestEnrollRetriesUnavailableUntilContextEnds(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	waits := 0
	c := e.newClient(t, e.tokenFile(t, e.dark, "node-dark"), runner.Retry{
		Jitter: func(d time.Duration) time.Duration { return d },
		After: func(time.Duration) <-chan time.Time {
			waits++
			if waits == 3 {
				cancel()
			}
			return time.After(0)
		}})
	_, err := c.Enroll(ctx, runner.EnrollRequest{})
	if !errors.Is(err, context.Canceled) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("err = %v, want the cancellation after Unavailable answers", err)
	}
	if waits != 3 {
		t.Fatalf("%d retries, want 3", waits)
	}
}

func TestEnrollRefusesPlaintextServer(t *testing.T) {
	_, err := enroll.New(enroll.Config{ServerURL: "http://server:8443", Tokens: runner.StaticToken("x")})
	if err == nil || !strings.Contains(err.Error(), "must be https://") {
		t.Fatalf("err = %v", err)
	}
}
