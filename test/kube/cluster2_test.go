package kube

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/verifier"
)

// A second cluster, with its own EC P-256 signing key (ES256 tokens) and the
// same issuer URL string as live (a self-managed cluster that copied live's
// --service-account-issuer), presents a genuine bound Runner token as live: it
// names live's issuer, live's Runner namespace, ServiceAccount and node, and is
// refused because live never published its key. The same token verifies
// against a verifier that trusts the second cluster's own JWKS, so the refusal
// is the key and nothing else.
func TestLiveRefusesSecondClusterTokenPresentedAsLive(t *testing.T) {
	e := liveCluster(t)
	assets := requireBinaries(t)
	ctx := t.Context()
	dir := t.TempDir()
	key, err := newECKey(dir, "second-sa")
	if err != nil {
		t.Fatal(err)
	}
	second, err := startAPIServer(ctx, assets, serverSpec{name: "second", issuer: e.srv.issuer, signing: key}, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := second.stop(); err != nil {
			t.Error(err)
		}
	})
	if _, err := second.createNode(ctx, runnerNode); err != nil {
		t.Fatal(err)
	}
	if _, err := second.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: runnerNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := second.cs.CoreV1().ServiceAccounts(runnerNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: runnerSA, Namespace: runnerNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := second.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod("compass-runner-forged", runnerSA, runnerNode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenFor(ctx, second.cs, runnerSA, pod, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}
	claims := jwtPart(t, tok, 1)
	if hdr := jwtPart(t, tok, 0); hdr["alg"] != "ES256" || claims["iss"] != e.srv.issuer {
		t.Fatalf("second cluster token alg/iss = %v/%v, want ES256/%s", hdr["alg"], claims["iss"], e.srv.issuer)
	}

	v := loadedVerifier(t, e.clusterFile)
	_, err = v.Verify(ctx, tok)
	if !errors.Is(err, verifier.ErrUnauthenticated) || errors.Is(err, verifier.ErrKeysUnavailable) {
		t.Fatalf("Verify as live: error %v, want ErrUnauthenticated only", err)
	}
	if verifier.ClusterOf(err) != "live" || !strings.HasSuffix(err.Error(), ": no key with that kid") {
		t.Errorf("Verify as live: error %q, want cluster live and cause %q", err, "no key with that kid")
	}
	// live's own Runner token still verifies in the same verifier afterwards.
	liveTok, err := kubeletToken(ctx, e.srv, runnerNode, e.pod)
	if err != nil {
		t.Fatal(err)
	}
	if subj, err := v.Verify(ctx, liveTok); err != nil || subj.ID != runnerID {
		t.Errorf("live token after the forged one: %q, %v; want %q", subj.ID, err, runnerID)
	}

	// Control: trusting the second cluster's JWKS, the token is a valid ES256
	// Runner token of that cluster.
	file := filepath.Join(dir, "second.yaml")
	if err := os.WriteFile(file, []byte(clusterFileFor("second", e.srv.issuer, second.url+"/openid/v1/jwks", second.caFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	subj, err := loadedVerifier(t, file).Verify(ctx, tok)
	if err != nil || subj.ID != "second/ip-10-0-1-5_ec2_internal" {
		t.Fatalf("Verify against the second cluster's keys: %q, %v; want second/ip-10-0-1-5_ec2_internal", subj.ID, err)
	}
}
