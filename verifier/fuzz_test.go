package verifier

import (
	"context"
	"errors"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// FuzzVerify feeds arbitrary strings to Verify (and Resolve) against a real
// issuer: it must never panic, never accept a token it did not sign, and
// always answer with the one failure shape.
func FuzzVerify(f *testing.F) {
	clk := newClock()
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Now: clk.Now})
	if err != nil {
		f.Fatal(err)
	}
	defer is.Close()
	caFile, err := is.WriteCAFileIn(f.TempDir(), "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	v, err := New([]RunnerCluster{{Name: "fuzz", Issuer: is.URL(), CAFile: caFile}}, WithClock(clk.Now))
	if err != nil {
		f.Fatal(err)
	}
	if err := v.Refresh(context.Background()); err != nil {
		f.Fatal(err)
	}
	good, _ := is.Token(kubeissuer.Pod{NodeName: "n"}, 0)
	f.Add(good)
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJpc3MiOiJodHRwczovL2EifQ.c2ln")
	f.Add("")
	r := NewResolver(v, nil)
	f.Fuzz(func(t *testing.T, tok string) {
		sub, err := v.Verify(context.Background(), tok)
		if err == nil {
			if tok != good {
				t.Fatalf("accepted a token the issuer did not sign: %+v", sub)
			}
			return
		}
		if !errors.Is(err, ErrUnauthenticated) && !errors.Is(err, ErrKeysUnavailable) {
			t.Fatalf("error outside the failure shape: %v", err)
		}
		if _, err := r.Resolve(context.Background(), tok, SubjectRunner); err == nil && tok != good {
			t.Fatal("Resolve accepted what Verify refused")
		}
	})
}
