package testkeys

import (
	"crypto/rsa"
	"encoding/json"
	"encoding/pem"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/kubeissuer"
)

// Every key comes out once: the pool's keys, then generated ones, all RSA
// 2048 with distinct kids; ES256 keys are generated and leave the pool alone.
func TestKeyHandsOutEachPoolKeyOnce(t *testing.T) {
	// From a full pool: go test -count=N runs this N times in one process,
	// and the first run used the pool up.
	mu.Lock()
	rest = poolPEM
	mu.Unlock()
	pooled := 0
	for b, r := pem.Decode(poolPEM); b != nil; b, r = pem.Decode(r) {
		pooled++
	}
	if pooled < 64 {
		t.Fatalf("pool holds %d keys", pooled)
	}
	ec, err := Key(kubeissuer.ES256)
	if err != nil {
		t.Fatal(err)
	}
	if ec.Algorithm != "ES256" || len(rest) != len(poolPEM) {
		t.Fatalf("ES256 key %q, pool left %d of %d bytes", ec.Algorithm, len(rest), len(poolPEM))
	}
	seen := map[string]bool{ec.KeyID: true}
	for i := range pooled + 1 { // one past the pool: generated
		k, err := Key(kubeissuer.RS256)
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		priv, ok := k.Key.(*rsa.PrivateKey)
		if !ok || priv.N.BitLen() != 2048 || k.Algorithm != "RS256" || k.Use != "sig" {
			t.Fatalf("key %d: %T %s %s", i, k.Key, k.Algorithm, k.Use)
		}
		want, err := kubeissuer.KeyOf(priv, kubeissuer.RS256)
		if err != nil || want.KeyID != k.KeyID {
			t.Fatalf("key %d: kid %q, thumbprint %q (%v)", i, k.KeyID, want.KeyID, err)
		}
		if seen[k.KeyID] {
			t.Fatalf("key %d handed out twice", i)
		}
		seen[k.KeyID] = true
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes of the pool left after %d keys", len(rest), pooled)
	}
}

// Token is the issuer's own token for the node: signed by its signing key,
// naming the node in the kubernetes.io claim.
func TestTokenIsTheIssuersTokenForTheNode(t *testing.T) {
	is := Issuer(t)
	tok := Token(t, is, "node-7")
	sig, err := jose.ParseSignedCompact(tok, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	key := is.SigningKey()
	payload, err := sig.Verify(key.Public())
	if err != nil {
		t.Fatalf("not signed by the issuer's key: %v", err)
	}
	var claims struct {
		Kubernetes struct {
			Node struct {
				Name string `json:"name"`
			} `json:"node"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if claims.Kubernetes.Node.Name != "node-7" {
		t.Fatalf("node %q, want node-7", claims.Kubernetes.Node.Name)
	}
}
