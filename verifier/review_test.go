package verifier

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/podwatch"
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
	got, err = ParseRunnerClusters([]byte(one("      server: https://10.0.0.1:6443\n      tokenFile: /t\n      watchPods: true\n")))
	if err != nil || !got[0].TokenReview.WatchPods {
		t.Fatalf("watchPods: true = %+v, %v", got[0].TokenReview, err)
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
		{"an unknown key", "      server: https://k.example\n      tokenFile: /t\n      token: abc\n", `verifier: cluster "prod" (clusters[0]): tokenReview: unknown key "token" (line 7); known keys are server, tokenFile, caFile, onUnavailable, watchPods`},
		{"watchPods a string", "      server: https://k.example\n      tokenFile: /t\n      watchPods: \"yes\"\n", `tokenReview: watchPods: want true or false (line 7)`},
		{"a duplicate key", "      server: https://k.example\n      server: https://k.example\n      tokenFile: /t\n", `tokenReview: duplicate key "server" (line 6)`},
		{"a list", "      - server\n", `tokenReview: want a mapping with server, tokenFile, caFile, onUnavailable and watchPods (line 5)`},
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

// A cluster's pod watch (tokenReview.watchPods) in the verifier: a pod it
// reports gone is refused at once, without asking the API server, counted
// as a rejection and told to WithPodGone; CheckPod names it (the kicker's
// question) for as long as one of its tokens could still verify, and no
// longer; a token of another pod is still reviewed (here the API server
// is unreachable, so offline verification accepts it).
func TestPodWatchRefusesAGonePodsTokenAtOnce(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("reviewer-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := clusterFor(t, is, "prod")
	// An API server nobody listens on: every review is unavailable.
	c.TokenReview = &TokenReview{Server: "https://127.0.0.1:1", TokenFile: tokenFile, WatchPods: true}
	var told []string
	v, err := New([]RunnerCluster{c}, WithClock(clk.Now), WithHTTPClient(is.Client()), WithLogger(testLogger()),
		WithPodGone(func(cluster string) { told = append(told, cluster) }))
	if err != nil {
		t.Fatal(err)
	}
	mustRefresh(t, v)
	pw := clusterNamed(t, v, "prod").life.review.Load().pods
	if pw == nil {
		t.Fatal("watchPods: no pod watch")
	}
	gone := kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "n-uid", PodName: "compass-runner-a", PodUID: "pod-gone"}
	live := gone
	live.PodName, live.PodUID = "compass-runner-b", "pod-live"
	goneTok, err := is.Token(gone, 0)
	if err != nil {
		t.Fatal(err)
	}
	liveTok, err := is.Token(live, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.CheckPod("prod", "pod-gone"); err != nil {
		t.Fatalf("CheckPod before the watch reported anything: %v", err)
	}

	pw.record(podwatch.Gone{UID: "pod-gone", Name: "compass-runner-a", Node: gone.NodeName, At: clk.Now()})
	if len(told) != 1 || told[0] != "prod" {
		t.Fatalf("WithPodGone told %v, want [prod]", told)
	}
	if err := v.CheckPod("prod", "pod-gone"); !errors.Is(err, ErrPodGone) || err.Error() != "verifier: the token's pod is gone: cluster prod, pod pod-gone" {
		t.Fatalf("CheckPod = %v, want ErrPodGone naming the cluster and pod", err)
	}
	for _, tc := range []struct{ cluster, uid string }{{"prod", "pod-live"}, {"prod", ""}, {"other", "pod-gone"}} {
		if err := v.CheckPod(tc.cluster, tc.uid); err != nil {
			t.Fatalf("CheckPod(%q, %q) = %v, want nil", tc.cluster, tc.uid, err)
		}
	}
	_, err = v.Verify(t.Context(), goneTok)
	if !errors.Is(err, ErrUnauthenticated) || err.Error() != "verifier: unauthenticated: cluster prod: the token's pod is gone (the cluster's pod watch)" {
		t.Fatalf("Verify of the gone pod's token = %v", err)
	}
	if sub, err := v.Verify(t.Context(), liveTok); err != nil || sub.Workload.PodUID != "pod-live" {
		t.Fatalf("Verify of another pod's token, the API server unreachable (offline fallback) = %+v, %v", sub, err)
	}
	st := v.Status()[0].Reviews
	if st == nil || !st.Watching || st.PodsGone != 1 || st.Rejected != 1 || st.FellBack != 1 || st.Accepted != 0 {
		t.Fatalf("review stats = %+v, want watching, 1 pod gone, 1 rejected, 1 fallback", st)
	}

	// Reported twice: counted once. Past the longest a token of the pod
	// could verify, forgotten.
	pw.record(podwatch.Gone{UID: "pod-gone", At: clk.Now()})
	if n := v.Status()[0].Reviews.PodsGone; n != 1 {
		t.Fatalf("a pod reported twice counted %d times", n)
	}
	clk.Advance(MinTokenLifetime + Leeway + time.Second) // the cluster's maxTokenLifetime: the default
	if err := v.CheckPod("prod", "pod-gone"); err != nil {
		t.Fatalf("CheckPod past maxTokenLifetime + Leeway = %v, want nil (forgotten)", err)
	}
}
