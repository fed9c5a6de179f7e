package verifiertest_test

import (
	"errors"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

func newIssuer(t *testing.T) *kubeissuer.Issuer {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Close() })
	return is
}

// The resolver accepts the registered issuer's token as its cluster's Runner
// and refuses another issuer's.
func TestResolver(t *testing.T) {
	prod, other := newIssuer(t), newIssuer(t)
	res := verifiertest.Resolver(t, prod, "prod", "tenant")

	tok, err := prod.Token(kubeissuer.Pod{NodeName: "node-1.internal"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := res.Resolve(t.Context(), tok, verifier.SubjectRunner)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if sub.ID != "prod/node-1_internal" || sub.Tenant != "tenant" {
		t.Fatalf("Resolve = %s in tenant %q, want prod/node-1_internal in tenant", sub.ID, sub.Tenant)
	}

	foreign, err := other.Token(kubeissuer.Pod{NodeName: "node-1.internal"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Resolve(t.Context(), foreign, verifier.SubjectRunner); !errors.Is(err, verifier.ErrUnauthenticated) {
		t.Fatalf("Resolve(another issuer's token) = %v, want ErrUnauthenticated", err)
	}
}

// New loads every cluster's keys before it returns: the first token costs
// no fetch.
func TestNewLoadsKeys(t *testing.T) {
	is := newIssuer(t)
	v := verifiertest.New(t, "", []verifier.RunnerCluster{verifiertest.Cluster(t, is, "prod")})
	fetches := is.JWKSFetches()
	tok, err := is.Token(kubeissuer.Pod{NodeName: "n"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	if got := is.JWKSFetches(); got != fetches || fetches == 0 {
		t.Fatalf("JWKS fetched %d times before the first token and %d after, want at least once before and none after", fetches, got)
	}
}
