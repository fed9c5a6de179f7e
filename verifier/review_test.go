package verifier

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
)

// A cluster's tokenReview is parsed as strictly as the rest of the entry:
// the defaults filled, each bad value refused naming the cluster, the key
// and why.
func TestParseRunnerClusters_TokenReview(t *testing.T) {
	one := func(review string) string {
		return "clusters:\n  - name: prod\n    issuer: https://a.example\n    tokenReview:\n" + review
	}
	got, err := ParseRunnerClusters([]byte(one("      server: https://kubernetes.default.svc\n      tokenFile: /var/run/secrets/compass/kube/token\n")))
	if err != nil {
		t.Fatal(err)
	}
	want := TokenReview{Server: "https://kubernetes.default.svc", TokenFile: "/var/run/secrets/compass/kube/token", OnUnavailable: ReviewFallbackOffline}
	if got[0].TokenReview == nil || *got[0].TokenReview != want {
		t.Fatalf("tokenReview = %+v, want %+v", got[0].TokenReview, want)
	}
	got, err = ParseRunnerClusters([]byte(one("      server: https://10.0.0.1:6443\n      tokenFile: /t\n      caFile: /ca.crt\n      onUnavailable: refuse\n")))
	if err != nil {
		t.Fatal(err)
	}
	want = TokenReview{Server: "https://10.0.0.1:6443", TokenFile: "/t", CAFile: "/ca.crt", OnUnavailable: ReviewFailClosed}
	if *got[0].TokenReview != want {
		t.Fatalf("tokenReview = %+v, want %+v", got[0].TokenReview, want)
	}
	got, err = ParseRunnerClusters([]byte("clusters:\n  - name: prod\n    issuer: https://a.example\n    tokenReview: ~\n"))
	if err != nil || got[0].TokenReview != nil {
		t.Fatalf("tokenReview: ~ = %+v, %v; want none", got[0].TokenReview, err)
	}

	for _, tc := range []struct {
		name, review, want string
	}{
		{"no server", "      tokenFile: /t\n", `verifier: cluster "prod" (clusters[0]): tokenReview: server: required`},
		{"an http server", "      server: http://kubernetes.default.svc\n      tokenFile: /t\n", `verifier: cluster "prod" (clusters[0]): tokenReview: server: "http://kubernetes.default.svc" must begin with lowercase "https://"`},
		{"a server with user info", "      server: https://u:p@k.example\n      tokenFile: /t\n", `tokenReview: server: "https://u:p@k.example" may not carry user info`},
		{"no tokenFile", "      server: https://k.example\n", `verifier: cluster "prod" (clusters[0]): tokenReview: tokenFile: required`},
		{"another fallback", "      server: https://k.example\n      tokenFile: /t\n      onUnavailable: allow\n", `tokenReview: onUnavailable: "allow" is neither offline nor refuse`},
		{"an unknown key", "      server: https://k.example\n      tokenFile: /t\n      token: abc\n", `verifier: cluster "prod" (clusters[0]): tokenReview: unknown key "token" (line 7); known keys are server, tokenFile, caFile, onUnavailable`},
		{"a duplicate key", "      server: https://k.example\n      server: https://k.example\n      tokenFile: /t\n", `tokenReview: duplicate key "server" (line 6)`},
		{"a list", "      - server\n", `tokenReview: want a mapping with server, tokenFile, caFile and onUnavailable (line 5)`},
		{"a number", "      server: https://k.example\n      tokenFile: 12\n", `tokenReview: tokenFile: want a string (line 6)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRunnerClusters([]byte(one(tc.review)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// Reload keeps a cluster's reviewer, and with it its remembered answers,
// while the cluster and its tokenReview are unchanged; a changed
// tokenReview gets a new reviewer and the cluster keeps its key set (like
// a deny list, it is no change of trust root); removing it removes the
// reviewer; a tokenReview whose token file is missing is refused whole,
// leaving what is in force.
func TestReload_TokenReviewKeptReplacedOrRemoved(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("reviewer-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := clusterFor(t, is, "prod") // its caFile path is part of the cluster
	withReview := func(on ReviewFallback) RunnerCluster {
		c := base
		c.TokenReview = &TokenReview{Server: "https://kubernetes.default.svc", TokenFile: tokenFile, OnUnavailable: on}
		return c
	}
	v := newVerifier(t, clk, withReview(ReviewFallbackOffline))
	mustRefresh(t, v)
	c := clusterNamed(t, v, "prod")
	first := c.life.review.Load()
	if first == nil || first.cfg.OnUnavailable != ReviewFallbackOffline {
		t.Fatalf("the reviewer after New: %+v", first)
	}

	mustReload(t, v, withReview(ReviewFallbackOffline))
	if clusterNamed(t, v, "prod") != c || c.life.review.Load() != first {
		t.Fatal("an unchanged tokenReview: the cluster or its reviewer was replaced")
	}
	mustReload(t, v, withReview(ReviewFailClosed))
	second := c.life.review.Load()
	if clusterNamed(t, v, "prod") != c || second == first || second.cfg.OnUnavailable != ReviewFailClosed {
		t.Fatalf("a changed tokenReview: cluster kept %v, reviewer %p (was %p), %+v; want the cluster kept and a new reviewer",
			clusterNamed(t, v, "prod") == c, second, first, second.cfg)
	}
	if st := v.Status(); st[0].Reviews == nil || st[0].Reviews.OnUnavailable != ReviewFailClosed || st[0].Keys == 0 {
		t.Fatalf("Status after the change: %+v, want refuse and the keys kept", st[0])
	}

	missing := withReview(ReviewFallbackOffline)
	missing.TokenReview.TokenFile = filepath.Join(t.TempDir(), "absent")
	if err := v.Reload([]RunnerCluster{missing}); err == nil || !strings.Contains(err.Error(), `verifier: cluster "prod": tokenReview: `) {
		t.Fatalf("Reload with a missing token file = %v, want refused naming the cluster and tokenReview", err)
	}
	if c.life.review.Load() != second {
		t.Fatal("a refused Reload changed the reviewer in force")
	}

	mustReload(t, v, base)
	if clusterNamed(t, v, "prod") != c || c.life.review.Load() != nil || v.Status()[0].Reviews != nil {
		t.Fatal("tokenReview removed: the reviewer is still in force, or the cluster was replaced")
	}
}
