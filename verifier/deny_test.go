package verifier

import (
	"errors"
	"strings"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
)

func TestParseRunnerClusters_Deny(t *testing.T) {
	got, err := ParseRunnerClusters([]byte(`
clusters:
  - name: prod
    issuer: https://a.example
    deny:
      nodes: [ip-10-0-1-5.ec2.internal, node-b]
      nodeUIDs: ["6f1d2c3a-0000-4000-8000-00000000000a"]
  - name: lab
    issuer: https://b.example
    deny: {}
  - name: quiet
    issuer: https://c.example
`))
	if err != nil {
		t.Fatal(err)
	}
	d := got[0].Deny
	if d == nil || strings.Join(d.Nodes, ",") != "ip-10-0-1-5.ec2.internal,node-b" ||
		strings.Join(d.NodeUIDs, ",") != "6f1d2c3a-0000-4000-8000-00000000000a" {
		t.Fatalf("prod deny = %+v", d)
	}
	if got[1].Deny == nil || len(got[1].Deny.Nodes)+len(got[1].Deny.NodeUIDs) != 0 {
		t.Fatalf("lab deny = %+v, want empty", got[1].Deny)
	}
	if got[2].Deny != nil {
		t.Fatalf("quiet deny = %+v, want nil", got[2].Deny)
	}
}

func TestParseRunnerClusters_DenyErrors(t *testing.T) {
	one := func(deny string) string {
		return "clusters:\n  - name: prod\n    issuer: https://a.example\n    deny:" + deny
	}
	cases := []struct{ name, yaml, want string }{
		{"not a mapping", one(" [a]\n"), `verifier: cluster "prod" (clusters[0]): deny: want a mapping with nodes and nodeUIDs lists (line 4)`},
		{"unknown key", one("\n      node: [a]\n"), `verifier: cluster "prod" (clusters[0]): deny: unknown key "node" (line 5); known keys are nodes, nodeUIDs`},
		{"duplicate key", one("\n      nodes: [a]\n      nodes: [b]\n"), `verifier: cluster "prod" (clusters[0]): deny: duplicate key "nodes" (line 6)`},
		{"nodes not a list", one("\n      nodes: a\n"), `verifier: cluster "prod" (clusters[0]): deny: nodes: want a list (line 5)`},
		{"entry not a string", one("\n      nodes: [[a]]\n"), `verifier: cluster "prod" (clusters[0]): deny: nodes[0]: want a string (line 5)`},
		{"entry a number", one("\n      nodes: [1]\n"), `verifier: cluster "prod" (clusters[0]): deny: nodes[0]: want a string (line 5)`},
		{"bad node name", one("\n      nodes: [Node_A]\n"), `verifier: cluster "prod" (clusters[0]): deny: nodes[0]: "Node_A" is not a Kubernetes node name`},
		{"node name with space", one("\n      nodes: [' a']\n"), `verifier: cluster "prod" (clusters[0]): deny: nodes[0]: " a" is not a Kubernetes node name`},
		{"empty UID", one("\n      nodeUIDs: ['']\n"), `verifier: cluster "prod" (clusters[0]): deny: nodeUIDs[0]: "" is not a Kubernetes UID`},
		{"UID with a newline", one("\n      nodeUIDs: [\"a\\nb\"]\n"), `verifier: cluster "prod" (clusters[0]): deny: nodeUIDs[0]: "a\nb" is not a Kubernetes UID`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRunnerClusters([]byte(tc.yaml))
			if err == nil || got != nil {
				t.Fatalf("parsed: %+v, %v", got, err)
			}
			if err.Error() != tc.want {
				t.Fatalf("error\n %s\nwant\n %s", err, tc.want)
			}
		})
	}
}

// Each list holds at most MaxDenyEntries entries, and a node name at most 253
// bytes (as Kubernetes allows): the limits accepted, one more refused.
func TestDenyLimits(t *testing.T) {
	many := make([]string, MaxDenyEntries+1)
	for i := range many {
		many[i] = "n"
	}
	long := strings.Repeat(strings.Repeat("a", 62)+".", 4)[:252] + "b" // 253 bytes, labels of 62
	for _, tc := range []struct {
		name string
		deny NodeDeny
		want string // "" = accepted
	}{
		{"nodes at the limit", NodeDeny{Nodes: many[:MaxDenyEntries]}, ""},
		{"nodes over the limit", NodeDeny{Nodes: many}, "more than 1000 entries in one list"},
		{"UIDs at the limit", NodeDeny{NodeUIDs: many[:MaxDenyEntries]}, ""},
		{"UIDs over the limit", NodeDeny{NodeUIDs: many}, "more than 1000 entries in one list"},
		{"name of 253 bytes", NodeDeny{Nodes: []string{long}}, ""},
		{"name of 254 bytes", NodeDeny{Nodes: []string{"c" + long}}, `nodes[0]: "c` + long + `" is not a Kubernetes node name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.deny
			_, err := New([]RunnerCluster{{Name: "a", Issuer: "https://a.example", Deny: &d}})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if want := `verifier: cluster "a": deny: ` + tc.want; err == nil || err.Error() != want {
				t.Fatalf("err = %v, want %s", err, want)
			}
		})
	}
}

// deny: with no value is no deny list, a list given as null is an empty
// list, and the other list of the mapping is still read after it.
func TestParseRunnerClusters_DenyNulls(t *testing.T) {
	got, err := ParseRunnerClusters([]byte(`
clusters:
  - name: prod
    issuer: https://a.example
    deny:
  - name: lab
    issuer: https://b.example
    deny:
      nodes:
      nodeUIDs: [u-1]
  - name: dev
    issuer: https://c.example
    deny: {nodeUIDs: ~, nodes: [n-1]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Deny != nil {
		t.Fatalf("prod deny = %+v, want none", got[0].Deny)
	}
	if d := got[1].Deny; d == nil || len(d.Nodes) != 0 || strings.Join(d.NodeUIDs, ",") != "u-1" {
		t.Fatalf("lab deny = %+v", d)
	}
	if d := got[2].Deny; d == nil || len(d.NodeUIDs) != 0 || strings.Join(d.Nodes, ",") != "n-1" {
		t.Fatalf("dev deny = %+v", d)
	}
	for _, v := range []string{"x", "'~'", "1"} {
		_, err := ParseRunnerClusters([]byte("clusters:\n  - name: prod\n    issuer: https://a.example\n    deny: " + v + "\n"))
		want := `verifier: cluster "prod" (clusters[0]): deny: want a mapping with nodes and nodeUIDs lists (line 4)`
		if err == nil || err.Error() != want {
			t.Fatalf("deny: %s: err = %v, want %s", v, err, want)
		}
	}
}

// A denied node is refused with the one failure shape, the cause names the
// rule and the node; other nodes of the cluster, and the same node name in
// another cluster, are not affected.
func TestVerify_DeniedNodes(t *testing.T) {
	clk := newClock()
	prod := newIssuer(t, kubeissuer.RS256, clk)
	lab := newIssuer(t, kubeissuer.ES256, clk)
	rc := clusterFor(t, prod, "prod")
	deny := &NodeDeny{Nodes: []string{"node-a.internal"}, NodeUIDs: []string{"uid-of-b"}}
	rc.Deny = deny
	v := newVerifier(t, clk, rc, clusterFor(t, lab, "lab"))
	mustRefresh(t, v)
	// The verifier keeps its own copy: a caller changing its list later changes nothing.
	deny.Nodes[0] = "node-c"

	sign := func(is *kubeissuer.Issuer, p kubeissuer.Pod) string {
		t.Helper()
		tok, err := is.Token(p, 0)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	cases := []struct {
		name  string
		tok   string
		cause string // "" when accepted
	}{
		{"denied by name", sign(prod, kubeissuer.Pod{NodeName: "node-a.internal", NodeUID: "uid-of-a"}),
			"verifier: unauthenticated: cluster prod: node denied: node node-a.internal is in deny.nodes"},
		{"denied by UID", sign(prod, kubeissuer.Pod{NodeName: "node-b", NodeUID: "uid-of-b"}),
			"verifier: unauthenticated: cluster prod: node denied: node node-b uid uid-of-b is in deny.nodeUIDs"},
		{"same name rebuilt with a new UID", sign(prod, kubeissuer.Pod{NodeName: "node-b", NodeUID: "uid-of-b2"}), ""},
		{"node without a UID", sign(prod, kubeissuer.Pod{NodeName: "node-b"}), ""},
		{"another node", sign(prod, kubeissuer.Pod{NodeName: "node-c", NodeUID: "uid-of-c"}), ""},
		{"the denied name in another cluster", sign(lab, kubeissuer.Pod{NodeName: "node-a.internal", NodeUID: "uid-of-b"}), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := verify(t, v, tc.tok)
			if tc.cause == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %s", sub.ID)
			}
			if !errors.Is(err, ErrUnauthenticated) || !errors.Is(err, ErrNodeDenied) || errors.Is(err, ErrKeysUnavailable) {
				t.Fatalf("err = %v, want ErrUnauthenticated and ErrNodeDenied", err)
			}
			if err.Error() != tc.cause {
				t.Fatalf("err = %q, want %q", err, tc.cause)
			}
			if ClusterOf(err) != "prod" {
				t.Fatalf("ClusterOf = %q", ClusterOf(err))
			}
		})
	}
}
