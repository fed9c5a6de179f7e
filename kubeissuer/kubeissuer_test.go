package kubeissuer_test

import (
	"context"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// The issuer's tokens verify in the verifier, for both algorithms: the
// issuer is only useful if it speaks the format the verifier checks.
func TestIssuerTokensVerify(t *testing.T) {
	for _, alg := range []kubeissuer.Alg{kubeissuer.RS256, kubeissuer.ES256} {
		t.Run(string(alg), func(t *testing.T) {
			is, err := kubeissuer.New(kubeissuer.Options{Alg: alg})
			if err != nil {
				t.Fatal(err)
			}
			defer is.Close()
			caFile, err := is.WriteCAFileIn(t.TempDir(), "dev")
			if err != nil {
				t.Fatal(err)
			}
			rc := verifier.RunnerCluster{Name: "dev", Issuer: is.URL(), CAFile: caFile}
			v, err := verifier.New([]verifier.RunnerCluster{rc})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := v.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			tok, err := is.Token(kubeissuer.Pod{NodeName: "node-1.example"}, 0)
			if err != nil {
				t.Fatal(err)
			}
			sub, err := v.Verify(ctx, tok)
			if err != nil {
				t.Fatal(err)
			}
			if sub.ID != "dev/node-1_example" || sub.Kind != verifier.SubjectRunner {
				t.Fatalf("subject = %+v", sub)
			}
			if d := time.Until(sub.Expiry); d < 590*time.Second || d > 600*time.Second {
				t.Fatalf("expiry in %s, want about 600s", d)
			}
		})
	}
}
