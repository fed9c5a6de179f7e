package verifier_test

import (
	"errors"
	"testing"

	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

const (
	admitUID  = "6b1d2f0e-1c1b-4a55-9d1e-0c3e1d2f4a01"
	admitUID2 = "6b1d2f0e-1c1b-4a55-9d1e-0c3e1d2f4a02"
)

// CheckNode answers for a node that Verify accepted earlier by the clusters
// and deny lists in force, without the token; CheckRunnerID does the same
// from a workload Runner ID, without the UID.
func TestCheckNode(t *testing.T) {
	is := testkeys.Issuer(t)
	c := verifiertest.Cluster(t, is, "prod")
	c.Deny = &verifier.NodeDeny{Nodes: []string{"bad.example"}, NodeUIDs: []string{admitUID}}
	v := verifiertest.New(t, "", []verifier.RunnerCluster{c})
	for _, tc := range []struct {
		name               string
		cluster, node, uid string
		want               error // nil: accepted
		wantMsg            string
	}{
		{"accepted", "prod", "good.example", admitUID2, nil, ""},
		{"accepted without a UID", "prod", "good.example", "", nil, ""},
		{"denied by name", "prod", "bad.example", "", verifier.ErrNodeDenied,
			"verifier: unauthenticated: cluster prod: node denied: node bad.example is in deny.nodes"},
		{"denied by UID", "prod", "good.example", admitUID, verifier.ErrNodeDenied,
			"verifier: unauthenticated: cluster prod: node denied: node good.example uid " + admitUID + " is in deny.nodeUIDs"},
		{"an invalid UID is not matched", "prod", "good.example", "not-a-uid", nil, ""},
		{"cluster not registered", "gone", "good.example", "", verifier.ErrClusterNotRegistered,
			"verifier: unauthenticated: cluster gone: cluster not registered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := v.CheckNode(tc.cluster, tc.node, tc.uid)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CheckNode = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !errors.Is(err, verifier.ErrUnauthenticated) || err.Error() != tc.wantMsg {
				t.Fatalf("CheckNode = %v, want %q (%v, ErrUnauthenticated)", err, tc.wantMsg, tc.want)
			}
		})
	}
	if err := v.CheckRunnerID(verifier.WorkloadRunnerID("prod", "bad.example")); !errors.Is(err, verifier.ErrNodeDenied) {
		t.Fatalf("CheckRunnerID(prod/bad_example) = %v, want ErrNodeDenied", err)
	}
	if err := v.CheckRunnerID(verifier.WorkloadRunnerID("prod", "good.example")); err != nil {
		t.Fatalf("CheckRunnerID(prod/good_example) = %v, want nil", err)
	}
	if err := v.CheckRunnerID("build-host-1"); !errors.Is(err, verifier.ErrUnauthenticated) {
		t.Fatalf("CheckRunnerID(minted ID) = %v, want ErrUnauthenticated", err)
	}
}

// CheckKey refuses a kid that the key set in force no longer has, once the
// issuer's current set is loaded, and accepts the kids it has.
func TestCheckKey(t *testing.T) {
	is := testkeys.Issuer(t)
	v := verifiertest.New(t, "", []verifier.RunnerCluster{verifiertest.Cluster(t, is, "prod")})
	old := is.SigningKey().KeyID
	if err := v.CheckKey("prod", old); err != nil {
		t.Fatalf("CheckKey(loaded kid) = %v, want nil", err)
	}
	fresh, err := is.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	is.Unpublish(old)
	if err := v.Refetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := v.CheckKey("prod", old); !errors.Is(err, verifier.ErrKeyRemoved) || !errors.Is(err, verifier.ErrUnauthenticated) {
		t.Fatalf("CheckKey(pulled kid) = %v, want ErrKeyRemoved", err)
	}
	if err := v.CheckKey("prod", fresh); err != nil {
		t.Fatalf("CheckKey(new kid) = %v, want nil", err)
	}
	if err := v.CheckKey("gone", fresh); !errors.Is(err, verifier.ErrClusterNotRegistered) {
		t.Fatalf("CheckKey(unregistered cluster) = %v, want ErrClusterNotRegistered", err)
	}
}

// A cluster whose key set was never loaded says nothing about its keys:
// CheckKey is not a refusal then (an outage is not a revocation).
func TestCheckKeyNeverLoaded(t *testing.T) {
	is := testkeys.Issuer(t)
	v, err := verifier.New([]verifier.RunnerCluster{verifiertest.Cluster(t, is, "prod")})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.CheckKey("prod", "any"); err != nil {
		t.Fatalf("CheckKey before any load = %v, want nil", err)
	}
}
