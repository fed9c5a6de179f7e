package kube

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/compass-runner/identity/tokenreview"
	"github.com/compass-runner/identity/verifier"
)

// The reviewer's identity in the review cluster: a ServiceAccount of its own
// namespace (where compass-server or compass-callout would run), granted
// only what package tokenreview documents.
const (
	reviewerNS   = "compass-system"
	reviewerSA   = "compass-tokenreview"
	reviewerRole = "compass-tokenreview"
	reviewPod    = "compass-runner-review"
)

// reviewCluster is a control plane of its own (the test deletes a pod and
// stops the server): node ip-10-0-1-5, the Runner ServiceAccount and a pod of
// it on that node, and a reviewer ServiceAccount allowed to create
// tokenreviews, whose token is in cfg.TokenFile.
type reviewCluster struct {
	srv  *apiServer
	spec serverSpec // what srv was started with, for srv.restart
	pod  *corev1.Pod
	cfg  tokenreview.Config
}

func startReviewCluster(t testing.TB) *reviewCluster {
	t.Helper()
	assets := requireBinaries(t)
	ctx := t.Context()
	dir := t.TempDir()
	key, err := newRSAKey(dir, "review-sa")
	if err != nil {
		t.Fatal(err)
	}
	// --api-audiences is the issuer alone, as a cluster that was not set
	// up for the Runner has it: a TokenReview naming compass-runner does
	// not need the API server to accept that audience for itself.
	spec := serverSpec{name: "review", signing: key, issuerAudienceOnly: true}
	srv, err := startAPIServer(ctx, assets, spec, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.stop(); err != nil {
			t.Error(err)
		}
	})
	if _, err := srv.createNode(ctx, runnerNode); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{runnerNS, reviewerNS} {
		if _, err := srv.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []struct{ ns, name string }{{runnerNS, runnerSA}, {runnerNS, "other"}, {reviewerNS, reviewerSA}} {
		if _, err := srv.cs.CoreV1().ServiceAccounts(a.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: a.name, Namespace: a.ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := srv.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod(reviewPod, runnerSA, runnerNode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The reviewer's RBAC, as package tokenreview documents it: create on
	// authentication.k8s.io tokenreviews and nothing else (narrower than the
	// built-in system:auth-delegator, which adds subjectaccessreviews),
	// bound to the reviewer's ServiceAccount cluster-wide (a TokenReview is
	// not namespaced).
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: reviewerRole},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"authentication.k8s.io"},
			Resources: []string{"tokenreviews"},
			Verbs:     []string{"create"},
		}},
	}
	if _, err := srv.cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: reviewerRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reviewerRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: reviewerSA, Namespace: reviewerNS}},
	}
	if _, err := srv.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The reviewer's own token is for the API server's audience (its
	// issuer), not compass-runner: with no audience it would get every
	// --api-audiences entry, compass-runner among them.
	tok, err := saToken(ctx, srv.cs, reviewerNS, reviewerSA, srv.issuer)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "reviewer-token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &reviewCluster{srv: srv, spec: spec, pod: pod, cfg: tokenreview.Config{Server: srv.url, TokenFile: tokenFile, CAFile: srv.caFile,
		Audience: runnerAudience, Namespace: runnerNS, ServiceAccount: runnerSA}}

	// RBAC's informers learn the binding within moments: until then the
	// reviewer is refused (403), which is unavailable, never a rejection.
	var last error
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		_, last = c.reviewer(t).Review(ctx, "not-a-token", time.Time{})
		return errors.Is(last, tokenreview.ErrRejected), nil
	})
	if err != nil {
		t.Fatalf("the reviewer's RBAC never took effect: %v (last: %v)", err, last)
	}
	return c
}

// reviewer is a new Reviewer of the cluster, with an empty cache.
func (c *reviewCluster) reviewer(t testing.TB, opts ...tokenreview.Option) *tokenreview.Reviewer {
	t.Helper()
	r, err := tokenreview.New(c.cfg, opts...)
	if err != nil {
		t.Fatalf("tokenreview.New: %v", err)
	}
	return r
}

// saToken is an unbound token of ServiceAccount ns/sa for audience, from
// TokenRequest as the admin.
func saToken(ctx context.Context, cs kubernetes.Interface, ns, sa, audience string) (string, error) {
	exp := int64(tokenSeconds)
	out, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return out.Status.Token, nil
}

// notAfterOf is when the verifier stops accepting token: its exp plus Leeway.
func notAfterOf(t *testing.T, token string) time.Time {
	t.Helper()
	exp, ok := jwtPart(t, token, 1)["exp"].(float64)
	if !ok {
		t.Fatal("token has no exp")
	}
	return time.Unix(int64(exp), 0).Add(verifier.Leeway)
}

// liveClock is a clock the test moves by hand (WithClock), starting at the
// real time, since the tokens' exp are real.
type liveClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *liveClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *liveClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Issue 34 against a real kube-apiserver: a Runner pod's bound token is
// accepted by TokenReview with the pod's name and UID; once the pod is
// deleted a new Reviewer is refused it; the first Reviewer's accepted answer
// is reused for MaxAcceptedAge and no longer; a token of another audience,
// of another ServiceAccount or bound to no pod is rejected; a reviewer
// without the RBAC, and a stopped API server, are unavailable.
//
// How long a deleted pod's token is still accepted is the sum of three
// bounds, which the integrator must know when choosing where to review: the
// API server's informers (milliseconds), kube-apiserver's own reuse of a
// successful token authentication (10 s, measured below), and a Reviewer's
// reuse of its accepted answer (MaxAcceptedAge, 10 s). A pod deleted
// gracefully is refused only once its deletion timestamp (now + its grace
// period) is a minute past, or the kubelet removes it; this test deletes
// with grace period 0, as the pod's removal.
func TestLiveTokenReviewRefusesADeletedPodsToken(t *testing.T) {
	c := startReviewCluster(t)
	ctx := t.Context()
	srv, pod := c.srv, c.pod
	tok, err := tokenFor(ctx, srv.cs, runnerSA, pod, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := notAfterOf(t, tok)

	// The first Reviewer, on a clock the test moves, and what it observes.
	clk := &liveClock{now: time.Now()}
	t0 := clk.Now()
	var mu sync.Mutex
	var last tokenreview.Event
	first := c.reviewer(t, tokenreview.WithClock(clk.Now), tokenreview.WithObserver(func(ev tokenreview.Event) {
		mu.Lock()
		defer mu.Unlock()
		last = ev
	}))
	lastEvent := func() tokenreview.Event {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	res, err := first.Review(ctx, tok, notAfter)
	if err != nil {
		t.Fatalf("the live pod's token: %v", err)
	}
	if want := (tokenreview.Result{PodName: reviewPod, PodUID: string(pod.UID)}); res != want {
		t.Fatalf("Result = %+v, want %+v", res, want)
	}

	// Genuine tokens that are not a Runner pod's, each refused by the API
	// server's answer.
	vault, err := tokenFor(ctx, srv.cs, runnerSA, pod, "vault")
	if err != nil {
		t.Fatal(err)
	}
	otherPod, err := srv.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod("other-sa", "other", runnerNode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherSA, err := tokenFor(ctx, srv.cs, "other", otherPod, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := tokenFor(ctx, srv.cs, runnerSA, nil, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, token, msg string }{
		{"another audience", vault, `tokenreview: token rejected: not authenticated: ` +
			`"[invalid bearer token, token audiences [\"vault\"] is invalid for the target audiences [\"compass-runner\"]]"`},
		{"another ServiceAccount", otherSA, `tokenreview: token rejected: authenticated as "system:serviceaccount:compass-runner:other", ` +
			`not system:serviceaccount:compass-runner:compass-runner`},
		{"bound to no pod", unbound, `tokenreview: token rejected: not bound to one pod (0 pod names, 0 pod UIDs)`},
	} {
		_, err := c.reviewer(t).Review(ctx, tc.token, notAfterOf(t, tc.token))
		if !errors.Is(err, tokenreview.ErrRejected) || errors.Is(err, tokenreview.ErrUnavailable) || err.Error() != tc.msg {
			t.Errorf("%s: error = %v\n  want ErrRejected %q", tc.name, err, tc.msg)
		}
	}

	// A reviewer whose credential lacks the RBAC: unavailable, which says
	// nothing about the token.
	otherCred, err := saToken(ctx, srv.cs, runnerNS, "other", srv.issuer)
	if err != nil {
		t.Fatal(err)
	}
	noRBAC := c.cfg
	noRBAC.TokenFile = filepath.Join(t.TempDir(), "other-token")
	if err := os.WriteFile(noRBAC.TokenFile, []byte(otherCred), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := tokenreview.New(noRBAC)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Review(ctx, tok, notAfter)
	if want := "tokenreview: API server unavailable: the reviewer may not create tokenreviews (403 Forbidden): see the package's RBAC"; !errors.Is(err, tokenreview.ErrUnavailable) || err.Error() != want {
		t.Errorf("a reviewer without RBAC: error = %v, want %q", err, want)
	}

	// The pod deleted. A new Reviewer (no cache) is refused the token once
	// the API server no longer reuses its own earlier success.
	deleted := time.Now()
	zero := int64(0)
	if err := srv.cs.CoreV1().Pods(runnerNS).Delete(ctx, reviewPod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	const wantDeleted = `tokenreview: token rejected: not authenticated: "[invalid bearer token, service account token has been invalidated]"`
	accepted := 0
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := c.reviewer(t).Review(ctx, tok, notAfter)
		switch {
		case err == nil:
			accepted++
			return false, nil
		case errors.Is(err, tokenreview.ErrRejected) && err.Error() == wantDeleted:
			return true, nil
		}
		return false, err
	})
	refusedAfter := time.Since(deleted)
	if err != nil {
		t.Fatalf("a new Reviewer after the deletion: %v", err)
	}
	t.Logf("the API server accepted the deleted pod's token %d times more, refused it %s after the deletion (%s after the first review)",
		accepted, refusedAfter.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	if refusedAfter > 10*time.Second+2*time.Second {
		t.Errorf("refused %s after the deletion, want within the API server's 10 s reuse of a success (and its informers' lag)", refusedAfter)
	}

	// The first Reviewer reuses its accepted answer, asked at t0, until
	// t0 + MaxAcceptedAge, and asks again from then on; the refusal is then
	// reused until notAfter, even with the API server gone.
	for _, at := range []time.Time{t0, t0.Add(tokenreview.MaxAcceptedAge - time.Nanosecond)} {
		clk.set(at)
		if res, err := first.Review(ctx, tok, notAfter); err != nil || res.PodUID != string(pod.UID) || !lastEvent().Cached {
			t.Fatalf("first Reviewer at t0+%s: %+v, %v, cached %v; want its cached acceptance", at.Sub(t0), res, err, lastEvent().Cached)
		}
	}
	clk.set(t0.Add(tokenreview.MaxAcceptedAge))
	if _, err := first.Review(ctx, tok, notAfter); !errors.Is(err, tokenreview.ErrRejected) || err.Error() != wantDeleted || lastEvent().Cached {
		t.Fatalf("first Reviewer at t0+MaxAcceptedAge: %v (cached %v), want a new request refused: %s", err, lastEvent().Cached, wantDeleted)
	}

	// The API server stopped: unavailable at once (connection refused), well
	// within RequestTimeout; the first Reviewer's refusal still stands.
	if err := srv.env.ControlPlane.GetAPIServer().Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.reviewer(t).Review(ctx, vault, notAfter)
	took := time.Since(start)
	wantDown := `tokenreview: API server unavailable: Post "` + srv.url + `/apis/authentication.k8s.io/v1/tokenreviews": dial tcp ` +
		srv.url[len("https://"):] + `: connect: connection refused`
	if !errors.Is(err, tokenreview.ErrUnavailable) || err.Error() != wantDown {
		t.Errorf("API server stopped: error = %v\n  want %s", err, wantDown)
	}
	if took >= tokenreview.RequestTimeout {
		t.Errorf("API server stopped: answered after %s, want within RequestTimeout (%s)", took, tokenreview.RequestTimeout)
	}
	clk.set(notAfter.Add(-time.Nanosecond))
	if _, err := first.Review(ctx, tok, notAfter); !errors.Is(err, tokenreview.ErrRejected) || !lastEvent().Cached {
		t.Errorf("first Reviewer with the API server stopped, just before notAfter: %v (cached %v), want its cached refusal", err, lastEvent().Cached)
	}
}

// BenchmarkLiveTokenReview: a Review answered from the cache, and one that
// is a TokenReview request to a real kube-apiserver on loopback (a Reviewer
// with nothing cached, and a zero notAfter caches nothing). The API server
// reuses its own success for 10 s, so the request is its cheapest answer:
// TLS, the reviewer's authentication and RBAC, and the cached token
// authentication.
func BenchmarkLiveTokenReview(b *testing.B) {
	c := startReviewCluster(b)
	ctx := b.Context()
	tok, err := tokenFor(ctx, c.srv.cs, runnerSA, c.pod, runnerAudience)
	if err != nil {
		b.Fatal(err)
	}
	r := c.reviewer(b)
	b.Run("cached", func(b *testing.B) {
		notAfter := time.Now().Add(time.Hour)
		if _, err := r.Review(ctx, tok, notAfter); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Review(ctx, tok, notAfter); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("request", func(b *testing.B) {
		r := c.reviewer(b) // nothing cached: a zero notAfter caches nothing
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Review(ctx, tok, time.Time{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
