// Package verifiertest registers test issuers (package kubeissuer) as Runner
// clusters of a real verifier, for the tests of the packages that verify
// Runner tokens: the callout, the door, the Runner and the deploy checks.
package verifiertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// Cluster registers is as the cluster name, trusting only its CA (written
// into a directory the test removes).
func Cluster(t testing.TB, is *kubeissuer.Issuer, name string) verifier.RunnerCluster {
	t.Helper()
	return ClusterIn(t, is, t.TempDir(), name)
}

// Issuer starts an issuer with opts and closes it when the test ends.
func Issuer(t testing.TB, opts kubeissuer.Options) *kubeissuer.Issuer {
	t.Helper()
	is, err := kubeissuer.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	return is
}

// ClusterIn is Cluster with the CA written into dir, for a test whose
// daemons read the CA from a directory of its own.
func ClusterIn(t testing.TB, is *kubeissuer.Issuer, dir, name string) verifier.RunnerCluster {
	t.Helper()
	ca, err := is.WriteCAFileIn(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return verifier.RunnerCluster{Name: name, Issuer: is.URL(), CAFile: ca}
}

// New returns a verifier for the clusters with every cluster's keys loaded;
// the test fails if one cannot be.
func New(t testing.TB, tenant string, clusters []verifier.RunnerCluster, opts ...verifier.Option) *verifier.RunnerVerifier {
	t.Helper()
	v, err := verifier.New(clusters, append([]verifier.Option{verifier.WithTenant(tenant)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	return v
}

// Resolver is the resolver of both doors over New(t, tenant, Cluster(t, is,
// name)), with no token store: every minted token is refused.
func Resolver(t testing.TB, is *kubeissuer.Issuer, name, tenant string) *verifier.Resolver {
	t.Helper()
	return verifier.NewResolver(New(t, tenant, []verifier.RunnerCluster{Cluster(t, is, name)}), nil)
}

// StaticCluster is the cluster-file entry of a cluster named name whose key
// set is a file (jwksFile: no fetch) holding one fresh ES256 public key,
// written once into dir and reused: a second cluster that verifies nothing
// but keeps a cluster file valid when the test removes its other cluster.
func StaticCluster(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name+"-jwks.json")
	if _, err := os.Stat(path); err != nil {
		key, err := kubeissuer.NewKey(kubeissuer.ES256)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{key.Public()}})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("  - name: %s\n    issuer: https://%s.invalid\n    jwksFile: %s\n", name, name, path)
}

// ClusterEntry is the cluster-file entry registering is as the cluster
// name, trusting only its CA (written into dir): the YAML form of Cluster.
func ClusterEntry(t testing.TB, is *kubeissuer.Issuer, dir, name string) string {
	t.Helper()
	c := ClusterIn(t, is, dir, name)
	return fmt.Sprintf("  - name: %s\n    issuer: %s\n    caFile: %s\n", c.Name, c.Issuer, c.CAFile)
}

// ClusterFile writes dir/clusters.yaml, the cluster file both daemons
// read, holding entries (ClusterEntry, StaticCluster), and returns its path.
func ClusterFile(t testing.TB, dir string, entries ...string) string {
	t.Helper()
	path := filepath.Join(dir, "clusters.yaml")
	if err := os.WriteFile(path, []byte("clusters:\n"+strings.Join(entries, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// CountingResolver passes every Resolve to Inner (a door's or the
// callout's resolver) and counts them, for a test that checks how often a
// token is verified (a stream authenticates once; a request the callout
// drops is never verified).
type CountingResolver struct {
	Inner interface {
		Resolve(context.Context, string, verifier.SubjectKind) (verifier.Subject, error)
	}
	calls atomic.Int64
}

// Resolve counts the call and passes it on.
func (c *CountingResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	c.calls.Add(1)
	return c.Inner.Resolve(ctx, tok, want)
}

// Calls is how many Resolve calls there have been.
func (c *CountingResolver) Calls() int64 { return c.calls.Load() }
