package kube

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/verifier"
)

// The API server publishes discovery and JWKS to anonymous callers, with the
// issuer and a jwks_uri on loopback (what an out-of-cluster Server fetches).
func TestLiveDiscoveryIsAnonymousOnLoopback(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	code, body, err := e.srv.getAnonymous(ctx, "/.well-known/openid-configuration")
	if err != nil || code != http.StatusOK {
		t.Fatalf("anonymous discovery: status %d, %v", code, err)
	}
	var disc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(body, &disc); err != nil {
		t.Fatal(err)
	}
	if disc.Issuer != e.srv.issuer {
		t.Errorf("discovery issuer = %q, want %q", disc.Issuer, e.srv.issuer)
	}
	if want := e.srv.url + "/openid/v1/jwks"; disc.JWKSURI != want {
		t.Errorf("discovery jwks_uri = %q, want %q", disc.JWKSURI, want)
	}
	code, body, err = e.srv.getAnonymous(ctx, "/openid/v1/jwks")
	if err != nil || code != http.StatusOK {
		t.Fatalf("anonymous JWKS: status %d, %v", code, err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(body, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 || set.Keys[0].KeyID != e.key.kid() || set.Keys[0].Algorithm != string(jose.RS256) {
		t.Fatalf("JWKS = %d keys (first kid/alg %v), want the one RS256 signing key", len(set.Keys), keyIDs(set))
	}
}

// DL-440 live smoke: the token the kubelet gets for the Runner pod verifies as
// Runner live/ip-10-0-1-5_ec2_internal, after the verifier's background first
// fetch, and resolves on a Runner door only.
func TestLiveRunnerTokenVerifies(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	tok, err := kubeletToken(ctx, e.srv, runnerNode, e.pod)
	if err != nil {
		t.Fatal(err)
	}
	loaded := make(chan verifier.LoadEvent, 1)
	v := newVerifier(t, e.clusterFile, verifier.WithLoadHook(func(ev verifier.LoadEvent) {
		select {
		case loaded <- ev:
		default:
		}
	}))
	v.Start(ctx)
	select {
	case ev := <-loaded:
		if ev.Cluster != "live" || ev.Err != nil || ev.Keys != 1 {
			t.Fatalf("first load = cluster %q, %d keys, err %v; want live, 1 key, nil", ev.Cluster, ev.Keys, ev.Err)
		}
	case <-time.After(settleTimeout):
		t.Fatal("the verifier's first key fetch did not finish")
	}

	subj, err := v.Verify(ctx, tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	sa, err := e.srv.cs.CoreV1().ServiceAccounts(runnerNS).Get(ctx, runnerSA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if subj.Kind != verifier.SubjectRunner || subj.ID != runnerID || subj.Tenant != "bootstrap" {
		t.Errorf("subject = %v %q tenant %q, want runner %q tenant bootstrap", subj.Kind, subj.ID, subj.Tenant, runnerID)
	}
	w := subj.Workload
	if w == nil {
		t.Fatal("subject has no workload")
	}
	want := verifier.Workload{Cluster: "live", Namespace: runnerNS, ServiceAccount: runnerSA,
		NodeName: runnerNode, NodeUID: string(e.node.UID), PodName: e.pod.Name, PodUID: string(e.pod.UID),
		JTI: w.JTI, IssuedAt: w.IssuedAt, KeyID: e.key.kid()}
	if *w != want {
		t.Errorf("workload = %+v, want %+v", *w, want)
	}
	if w.JTI == "" {
		t.Error("workload has no jti")
	}
	if got := subj.Expiry.Sub(w.IssuedAt); got != tokenSeconds*time.Second {
		t.Errorf("exp - iat = %s, want %ds", got, tokenSeconds)
	}
	if sa.UID == "" {
		t.Error("ServiceAccount has no UID")
	}

	r := verifier.NewResolver(v, nil)
	got, err := r.Resolve(ctx, tok, verifier.SubjectRunner)
	if err != nil || got.ID != runnerID {
		t.Errorf("Resolve(runner) = %q, %v; want %q", got.ID, err, runnerID)
	}
	_, err = r.Resolve(ctx, tok, verifier.SubjectAccount)
	if !errors.Is(err, verifier.ErrWrongKind) || !errors.Is(err, verifier.ErrUnauthenticated) {
		t.Errorf("Resolve(account) error = %v, want ErrWrongKind and ErrUnauthenticated", err)
	}
}

// The claim names of a real bound token are those DL-440 §Verification reads:
// aud, exp, iat, iss, jti, sub and kubernetes.io{namespace, node{name,uid},
// pod{name,uid}, serviceaccount{name,uid}}. Kubernetes also sets nbf (which
// the verifier's step 4 checks); nothing else is there.
func TestLiveTokenClaimNames(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	tok, err := kubeletToken(ctx, e.srv, runnerNode, e.pod)
	if err != nil {
		t.Fatal(err)
	}
	hdr := jwtPart(t, tok, 0)
	if got := sortedKeys(hdr); !slices.Equal(got, []string{"alg", "kid"}) {
		t.Errorf("header names = %v, want [alg kid]", got)
	}
	if hdr["alg"] != "RS256" || hdr["kid"] != e.key.kid() {
		t.Errorf("header alg/kid = %v/%v, want RS256/%s", hdr["alg"], hdr["kid"], e.key.kid())
	}
	claims := jwtPart(t, tok, 1)
	if got, want := sortedKeys(claims), []string{"aud", "exp", "iat", "iss", "jti", "kubernetes.io", "nbf", "sub"}; !slices.Equal(got, want) {
		t.Errorf("claim names = %v, want %v", got, want)
	}
	k8s, _ := claims["kubernetes.io"].(map[string]any)
	if got, want := sortedKeys(k8s), []string{"namespace", "node", "pod", "serviceaccount"}; !slices.Equal(got, want) {
		t.Errorf("kubernetes.io names = %v, want %v", got, want)
	}
	for name, wantName := range map[string]string{"node": runnerNode, "pod": e.pod.Name, "serviceaccount": runnerSA} {
		ref, _ := k8s[name].(map[string]any)
		if got := sortedKeys(ref); !slices.Equal(got, []string{"name", "uid"}) {
			t.Errorf("kubernetes.io.%s names = %v, want [name uid]", name, got)
		}
		if ref["name"] != wantName || ref["uid"] == "" {
			t.Errorf("kubernetes.io.%s = %v, want name %s and a uid", name, ref, wantName)
		}
	}
	if k8s["namespace"] != runnerNS {
		t.Errorf("kubernetes.io.namespace = %v, want %s", k8s["namespace"], runnerNS)
	}
	aud, _ := claims["aud"].([]any)
	if len(aud) != 1 || aud[0] != runnerAudience {
		t.Errorf("aud = %v, want [%s]", claims["aud"], runnerAudience)
	}
	if claims["iss"] != e.srv.issuer || claims["sub"] != "system:serviceaccount:"+runnerNS+":"+runnerSA {
		t.Errorf("iss/sub = %v/%v", claims["iss"], claims["sub"])
	}
}

// Node A's kubelet cannot obtain node B's Runner token (DL-440 threat "Node A
// claims node B's ID": the Node authorizer).
func TestLiveOtherKubeletIsRefusedTheRunnerToken(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	if _, err := kubeletToken(ctx, e.srv, runnerNode, e.pod); err != nil {
		t.Fatal(err) // the graph knows the pod: a refusal below is not a lag
	}
	_, err := tokenFor(ctx, e.srv.asKubelet(otherNode), runnerSA, e.pod, runnerAudience)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("token for the Runner pod as %s's kubelet: error %v, want Forbidden", otherNode, err)
	}
}

// Genuine API-server tokens that are not the Runner's identity are refused.
// Each is first shown to be accepted by the API server itself (TokenReview),
// so the refusal is the verifier's.
func TestLiveRefusesOtherTokens(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	v := loadedVerifier(t, e.clusterFile)
	// With both policies on, no one may ask the API server for these two (a
	// kubelet may ask only for the audiences its pod's volumes name), so
	// they are signed as the API server signs a TokenRequest's token.
	otherAud, err := e.signedRunnerToken(t, "vault", e.pod)
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := e.signedRunnerToken(t, runnerAudience, nil)
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := e.legacySecretToken(t)
	if err != nil {
		t.Fatal(err)
	}
	otherSA, err := e.otherServiceAccountToken(t)
	if err != nil {
		t.Fatal(err)
	}

	runnerUser := "system:serviceaccount:" + runnerNS + ":" + runnerSA
	tests := []struct {
		name      string
		token     string
		audiences []string // for the API server's own review
		user      string   // whom the API server says the token is
		cluster   string   // the cluster the verifier's error names
		cause     string   // the verifier's fixed cause
	}{
		{"another audience", otherAud, []string{"vault"}, runnerUser, "live", "audience mismatch"},
		{"legacy Secret-based token", legacy, nil, runnerUser, "", "unknown issuer"},
		{"another ServiceAccount", otherSA, []string{runnerAudience}, "system:serviceaccount:" + runnerNS + ":other", "live", "sub is not the Runner ServiceAccount"},
		{"token bound to no pod", unbound, []string{runnerAudience}, runnerUser, "live", "kubernetes.io pod name missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := e.srv.reviewToken(ctx, tc.token, tc.audiences...)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Authenticated || st.User.Username != tc.user {
				t.Fatalf("API server review: authenticated %v as %q (%s), want %q", st.Authenticated, st.User.Username, st.Error, tc.user)
			}
			_, err = v.Verify(ctx, tc.token)
			if !errors.Is(err, verifier.ErrUnauthenticated) || errors.Is(err, verifier.ErrKeysUnavailable) {
				t.Fatalf("Verify error = %v, want ErrUnauthenticated only", err)
			}
			if got := verifier.ClusterOf(err); got != tc.cluster {
				t.Errorf("error names cluster %q, want %q", got, tc.cluster)
			}
			if !strings.HasSuffix(err.Error(), ": "+tc.cause) {
				t.Errorf("error = %q, want cause %q", err, tc.cause)
			}
		})
	}
}

// legacySecretToken makes a legacy Secret-based token for the Runner
// ServiceAccount: the Secret the tokens controller would fill (this tier runs
// no controller manager) and the token it would write, in its format (iss
// kubernetes/serviceaccount, no aud, no exp) and signed with the cluster's key.
// The API server's TokenReview then proves the token genuine.
func (e *liveEnv) legacySecretToken(t *testing.T) (string, error) {
	t.Helper()
	ctx := t.Context()
	sa, err := e.srv.cs.CoreV1().ServiceAccounts(runnerNS).Get(ctx, runnerSA, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	const secretName = "compass-runner-legacy-token"
	signer, err := e.clusterSigner()
	if err != nil {
		return "", err
	}
	tok, err := jwt.Signed(signer).Claims(map[string]any{
		"iss":                                    "kubernetes/serviceaccount",
		"sub":                                    "system:serviceaccount:" + runnerNS + ":" + runnerSA,
		"kubernetes.io/serviceaccount/namespace": runnerNS,
		"kubernetes.io/serviceaccount/secret.name":          secretName,
		"kubernetes.io/serviceaccount/service-account.name": runnerSA,
		"kubernetes.io/serviceaccount/service-account.uid":  string(sa.UID),
	}).Serialize()
	if err != nil {
		return "", err
	}
	_, err = e.srv.cs.CoreV1().Secrets(runnerNS).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: runnerNS, Annotations: map[string]string{
			corev1.ServiceAccountNameKey: runnerSA,
			corev1.ServiceAccountUIDKey:  string(sa.UID),
		}},
		Type: corev1.SecretTypeServiceAccountToken,
		Data: map[string][]byte{corev1.ServiceAccountTokenKey: []byte(tok)},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return tok, nil
}

// clusterSigner signs as the API server signs its tokens: RS256 with the
// cluster's key, its kid in the header.
func (e *liveEnv) clusterSigner() (jose.Signer, error) {
	return jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: e.key.signer},
		(&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), e.key.kid()))
}

// signedRunnerToken is a token of the Runner ServiceAccount for audience,
// bound to pod (and its node) or to nothing, made as the API server makes a
// TokenRequest's token: its claims, signed with the cluster's key. With both
// policies on, no one can ask the API server for one that is not the
// kubelet's own (only a kubelet may ask for a Runner token, NodeRestriction
// binds a kubelet's tokens to its pods and limits their audiences to those
// its pods name). The API server's TokenReview then proves it genuine.
func (e *liveEnv) signedRunnerToken(t *testing.T, audience string, pod *corev1.Pod) (string, error) {
	t.Helper()
	ctx := t.Context()
	sa, err := e.srv.cs.CoreV1().ServiceAccounts(runnerNS).Get(ctx, runnerSA, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	signer, err := e.clusterSigner()
	if err != nil {
		return "", err
	}
	k8s := map[string]any{
		"namespace":      runnerNS,
		"serviceaccount": map[string]any{"name": runnerSA, "uid": string(sa.UID)},
	}
	if pod != nil {
		node, err := e.srv.cs.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		k8s["pod"] = map[string]any{"name": pod.Name, "uid": string(pod.UID)}
		k8s["node"] = map[string]any{"name": node.Name, "uid": string(node.UID)}
	}
	now := time.Now()
	return jwt.Signed(signer).Claims(map[string]any{
		"iss":           e.srv.issuer,
		"sub":           "system:serviceaccount:" + runnerNS + ":" + runnerSA,
		"aud":           []string{audience},
		"iat":           now.Unix(),
		"nbf":           now.Unix(),
		"exp":           now.Add(10 * time.Minute).Unix(),
		"jti":           "signed-" + audience,
		"kubernetes.io": k8s,
	}).Serialize()
}

// otherServiceAccountToken is a bound compass-runner-audience token of
// ServiceAccount "other" for a pod on the Runner's node.
func (e *liveEnv) otherServiceAccountToken(t *testing.T) (string, error) {
	t.Helper()
	ctx := t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: runnerNS}}
	if _, err := e.srv.cs.CoreV1().ServiceAccounts(runnerNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	const podName = "other-sa"
	pod, err := e.srv.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod(podName, "other", runnerNode), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		pod, err = e.srv.cs.CoreV1().Pods(runnerNS).Get(ctx, podName, metav1.GetOptions{})
	}
	if err != nil {
		return "", err
	}
	return tokenFor(ctx, e.srv.cs, "other", pod, runnerAudience)
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

func keyIDs(set jose.JSONWebKeySet) []string {
	var out []string
	for _, k := range set.Keys {
		out = append(out, k.KeyID+"/"+k.Algorithm)
	}
	return out
}
