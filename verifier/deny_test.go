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
	many := make([]string, MaxDenyEntries+1)
	for i := range many {
		many[i] = "n"
	}
	_, err := NewRunnerVerifier([]RunnerCluster{{Name: "a", Issuer: "https://a.example", Deny: &NodeDeny{Nodes: many}}}, "t", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "deny: more than 1000 entries in one list") {
		t.Fatalf("%d entries: err = %v", len(many), err)
	}
	if _, err := NewRunnerVerifier([]RunnerCluster{{Name: "a", Issuer: "https://a.example", Deny: &NodeDeny{Nodes: many[:MaxDenyEntries]}}}, "t", nil, nil); err != nil {
		t.Fatalf("%d entries: %v", MaxDenyEntries, err)
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
