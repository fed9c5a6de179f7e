package verifier

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
)

// countingTransport counts the requests it passes on to next. It is not an
// *http.Transport, so a caFile cluster cannot use it.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// Each option of New changes what it says and nothing else; a verifier
// built with no option at all has the documented defaults (no tenant, the
// default transport, the real clock). The issuer signs with the real clock,
// so a clock an hour ahead finds its 600 s tokens expired.
func TestNewAppliesEachOption(t *testing.T) {
	is := newIssuer(t, kubeissuer.ES256, nil)
	withCA := clusterFor(t, is, "prod")                   // trusts the issuer's CA through caFile
	noCA := RunnerCluster{Name: "prod", Issuer: is.URL()} // trusts what the HTTP client trusts
	later := func() time.Time { return time.Now().Add(time.Hour) }
	counting := &countingTransport{next: is.Client().Transport}

	for _, tc := range []struct {
		name       string
		cluster    RunnerCluster
		opts       []Option
		wantTenant string
		wantErr    string // from Verify; "" when the token verifies
		fetches    int64  // requests through counting, when it is the client
	}{
		{name: "no option", cluster: withCA},
		{name: "tenant", cluster: withCA, opts: []Option{WithTenant("bootstrap")}, wantTenant: "bootstrap"},
		{name: "the last tenant wins", cluster: withCA, opts: []Option{WithTenant("a"), WithTenant("b")}, wantTenant: "b"},
		{name: "clock", cluster: withCA, opts: []Option{WithClock(later)},
			wantErr: "verifier: unauthenticated: cluster prod: token expired"},
		{name: "nil clock leaves the one set", cluster: withCA, opts: []Option{WithClock(later), WithClock(nil)},
			wantErr: "verifier: unauthenticated: cluster prod: token expired"},
		{name: "nil clock is the real clock", cluster: withCA, opts: []Option{WithClock(nil)}},
		{name: "HTTP client", cluster: noCA, opts: []Option{WithHTTPClient(&http.Client{Transport: counting})}, fetches: 2},
		{name: "nil HTTP client leaves the one set", cluster: noCA,
			opts: []Option{WithHTTPClient(&http.Client{Transport: counting}), WithHTTPClient(nil)}, fetches: 2},
		{name: "HTTP client and caFile", cluster: withCA, opts: []Option{WithHTTPClient(&http.Client{Transport: &http.Transport{}})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counting.n.Store(0)
			v, err := New([]RunnerCluster{tc.cluster}, append([]Option{WithLogger(testLogger())}, tc.opts...)...)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			mustRefresh(t, v)
			if n := counting.n.Load(); n != tc.fetches {
				t.Fatalf("%d requests through the HTTP client, want %d", n, tc.fetches)
			}
			sub, err := verify(t, v, mustToken(t, is, "n"))
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Verify: %v, want %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if sub.Tenant != tc.wantTenant {
				t.Fatalf("Subject.Tenant = %q, want %q", sub.Tenant, tc.wantTenant)
			}
		})
	}
}

// Without WithHTTPClient a cluster with no caFile is fetched with the
// default transport, which does not trust a private issuer's CA: the
// client WithHTTPClient sets is the one the fetches use.
func TestNewWithoutHTTPClientTrustsTheSystemRoots(t *testing.T) {
	is := newIssuer(t, kubeissuer.ES256, nil)
	v, err := New([]RunnerCluster{{Name: "prod", Issuer: is.URL()}}, WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	err = v.Refresh(t.Context())
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); !ok {
		t.Fatalf("Refresh: %v, want an unknown authority", err)
	}
}

// New refuses what cannot work, with an error naming the cluster and the
// cause; the HTTP client is one of them when a cluster has a caFile, which
// needs a transport it can clone.
func TestNewRefusesWhatCannotWork(t *testing.T) {
	is := newIssuer(t, kubeissuer.ES256, nil)
	prod := clusterFor(t, is, "prod")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		clusters []RunnerCluster
		opts     []Option
		want     string
	}{
		{
			name:     "caFile with a transport that is not an *http.Transport",
			clusters: []RunnerCluster{prod},
			opts:     []Option{WithHTTPClient(&http.Client{Transport: &countingTransport{next: http.DefaultTransport}})},
			want:     `verifier: cluster "prod": caFile: the HTTP client's transport is not an *http.Transport`,
		},
		{
			name:     "caFile missing",
			clusters: []RunnerCluster{{Name: "prod", Issuer: is.URL(), CAFile: missing}},
			want:     `verifier: cluster "prod": caFile: open ` + missing + `: no such file or directory`,
		},
		{
			name:     "caFile without a certificate",
			clusters: []RunnerCluster{{Name: "prod", Issuer: is.URL(), CAFile: notPEM}},
			want:     `verifier: cluster "prod": caFile: ` + notPEM + ` holds no PEM certificate`,
		},
		{
			name:     "jwksFile missing",
			clusters: []RunnerCluster{{Name: "prod", Issuer: is.URL(), JWKSFile: missing}},
			want:     `verifier: cluster "prod": jwksFile: open ` + missing + `: no such file or directory`,
		},
		{
			name:     "two clusters of one name",
			clusters: []RunnerCluster{{Name: "a", Issuer: "https://a.example"}, {Name: "a", Issuer: "https://b.example"}},
			want:     `verifier: cluster "a" (clusters[1]): name: duplicate of clusters[0]`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := New(tc.clusters, append([]Option{WithLogger(testLogger())}, tc.opts...)...)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("New: %v, %v; want the error %s", v, err, tc.want)
			}
			if v != nil {
				t.Fatal("New returned a verifier with its error")
			}
		})
	}
}

// NewRunnerVerifier, deprecated, still builds the verifier New builds from
// the same values: the tenant, the HTTP client and the clock by position
// (nil: the defaults), then the options.
func TestNewRunnerVerifierStillWorks(t *testing.T) {
	is := newIssuer(t, kubeissuer.ES256, nil)
	tok := mustToken(t, is, "n")
	later := func() time.Time { return time.Now().Add(time.Hour) }

	t.Run("nil client and clock are the defaults", func(t *testing.T) {
		v, err := NewRunnerVerifier([]RunnerCluster{clusterFor(t, is, "prod")}, "bootstrap", nil, nil, WithLogger(testLogger()))
		if err != nil {
			t.Fatal(err)
		}
		mustRefresh(t, v)
		sub, err := verify(t, v, tok)
		if err != nil || sub.Tenant != "bootstrap" {
			t.Fatalf("Verify: %+v, %v; want tenant bootstrap", sub, err)
		}
	})
	t.Run("client, clock and options", func(t *testing.T) {
		counting := &countingTransport{next: is.Client().Transport}
		var loads atomic.Int64
		v, err := NewRunnerVerifier([]RunnerCluster{{Name: "prod", Issuer: is.URL()}}, "bootstrap",
			&http.Client{Transport: counting}, later, WithLoadHook(func(LoadEvent) { loads.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := counting.n.Load(); n != 2 {
			t.Fatalf("%d requests through the client, want 2", n)
		}
		if n := loads.Load(); n != 1 {
			t.Fatalf("%d loads reported to the hook, want 1", n)
		}
		const want = "verifier: unauthenticated: cluster prod: token expired" // by the clock an hour ahead
		if _, err := verify(t, v, tok); err == nil || err.Error() != want {
			t.Fatalf("Verify: %v, want %s", err, want)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		_, err := NewRunnerVerifier([]RunnerCluster{clusterFor(t, is, "prod")}, "", &http.Client{Transport: &countingTransport{}}, nil)
		const want = `verifier: cluster "prod": caFile: the HTTP client's transport is not an *http.Transport`
		if err == nil || err.Error() != want {
			t.Fatalf("NewRunnerVerifier: %v, want %s", err, want)
		}
	})
}
