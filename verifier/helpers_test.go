package verifier

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// fakeClock is the injected clock: tests move it, nothing sleeps.
type fakeClock = testutil.Clock

func newClock() *fakeClock { return testutil.NewClock(time.Now().Truncate(time.Second)) }

// suiteLogs collects every log line of the verifiers built by the tests, so
// TestMain can search them for token material.
var suiteLogs testlog.Buffer

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&suiteLogs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// presented records every token the suite hands to Verify or Resolve, and
// every error text it gets back, for TestNoTokenInLogs.
var presented struct {
	mu     sync.Mutex
	tokens []string
	errs   []string
}

func record(tok string, err error) {
	presented.mu.Lock()
	defer presented.mu.Unlock()
	presented.tokens = append(presented.tokens, tok)
	if err != nil {
		presented.errs = append(presented.errs, err.Error())
	}
}

func newIssuer(t *testing.T, alg kubeissuer.Alg, clk *fakeClock) *kubeissuer.Issuer {
	t.Helper()
	opts := kubeissuer.Options{NewKey: testkeys.Key, Alg: alg}
	if clk != nil {
		opts.Now = clk.Now
	}
	is, err := kubeissuer.New(opts)
	if err != nil {
		t.Fatalf("kubeissuer.New: %v", err)
	}
	t.Cleanup(func() { is.Close() })
	return is
}

func clusterFor(t *testing.T, is *kubeissuer.Issuer, name string) RunnerCluster {
	t.Helper()
	caFile, err := is.WriteCAFileIn(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	return RunnerCluster{Name: name, Issuer: is.URL(), CAFile: caFile}
}

func newVerifier(t *testing.T, clk *fakeClock, clusters ...RunnerCluster) *RunnerVerifier {
	t.Helper()
	var now func() time.Time
	if clk != nil {
		now = clk.Now
	}
	v, err := New(clusters, WithTenant("tenant-1"), WithClock(now), WithLogger(testLogger()))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

// forge is a token of is's claims for node n signed with key, which is
// never published: an attacker's token, or a kid is has not rotated to.
func forge(t *testing.T, key jose.JSONWebKey, is *kubeissuer.Issuer) string {
	t.Helper()
	tok, err := kubeissuer.SignWith(key, is.Claims(kubeissuer.Pod{NodeName: "n"}, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// loadedFaultyProd is loadedProd with an issuer whose discovery and JWKS
// answers f can break, for the tests of fetch failures.
func loadedFaultyProd(t *testing.T) (*fakeClock, *fault, *kubeissuer.Issuer, *RunnerVerifier) {
	t.Helper()
	clk := newClock()
	f := &fault{}
	is := newIssuerWrapped(t, clk, f.wrap)
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	mustRefresh(t, v)
	return clk, f, is, v
}

// pair is two issuers on one injected clock, registered as the clusters a
// and b: what the reload tests change one of and keep the other.
type pair struct {
	clk    *fakeClock
	a, b   *kubeissuer.Issuer
	ra, rb RunnerCluster
}

// newPair makes a pair with a signing with algA and b with algB.
func newPair(t *testing.T, algA, algB kubeissuer.Alg) pair {
	t.Helper()
	p := pair{clk: newClock()}
	p.a, p.b = newIssuer(t, algA, p.clk), newIssuer(t, algB, p.clk)
	p.ra, p.rb = clusterFor(t, p.a, "a"), clusterFor(t, p.b, "b")
	return p
}

// loadedProd is an issuer of alg registered as the cluster prod of a
// verifier on a fresh injected clock, with its keys loaded.
func loadedProd(t *testing.T, alg kubeissuer.Alg) (*fakeClock, *kubeissuer.Issuer, *RunnerVerifier) {
	t.Helper()
	clk := newClock()
	is := newIssuer(t, alg, clk)
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	mustRefresh(t, v)
	return clk, is, v
}

func mustRefresh(t *testing.T, v *RunnerVerifier) {
	t.Helper()
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
}

// mustToken is is's token for node (testkeys.Token).
var mustToken = testkeys.Token

func mustSign(t *testing.T, is *kubeissuer.Issuer, claims map[string]any) string {
	t.Helper()
	tok, err := is.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func verify(t *testing.T, v *RunnerVerifier, tok string) (Subject, error) {
	t.Helper()
	sub, err := v.Verify(context.Background(), tok)
	record(tok, err)
	return sub, err
}

func newIssuerWrapped(t *testing.T, clk *fakeClock, wrap func(http.Handler) http.Handler) *kubeissuer.Issuer {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Now: clk.Now, Wrap: wrap})
	if err != nil {
		t.Fatalf("kubeissuer.New: %v", err)
	}
	t.Cleanup(func() { is.Close() })
	return is
}

// fault switches an issuer's responses between healthy and each failure an
// issuer (or its network path) can produce.
type fault struct {
	mu   sync.Mutex
	mode string
}

func (f *fault) set(m string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode = m
}

func (f *fault) get() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode
}

func (f *fault) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		disc := strings.HasSuffix(r.URL.Path, "/.well-known/openid-configuration")
		switch f.get() {
		case "503":
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		case "stall":
			<-r.Context().Done() // past the client's FetchTimeout
		case "huge":
			w.Write(bytes.Repeat([]byte(" "), 2<<20))
		case "redirect-http":
			http.Redirect(w, r, "http://"+r.Host+r.URL.Path, http.StatusFound)
		case "issuer-differs":
			if disc {
				fmt.Fprintf(w, `{"issuer":"https://%s/other","jwks_uri":"https://%s/openid/v1/jwks"}`, r.Host, r.Host)
				return
			}
			next.ServeHTTP(w, r)
		case "jwks-http":
			if disc {
				fmt.Fprintf(w, `{"issuer":"https://%s","jwks_uri":"http://%s/openid/v1/jwks"}`, r.Host, r.Host)
				return
			}
			next.ServeHTTP(w, r)
		case "garbage":
			w.Write([]byte("<html>not json</html>"))
		case "empty-set":
			if disc {
				next.ServeHTTP(w, r)
				return
			}
			w.Write([]byte(`{"keys":[]}`))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func newTextLogger(w *testlog.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
