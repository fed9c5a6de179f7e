// Package answerfuzz fuzzes callout.Responder.Answer from outside the callout
// package. It lives apart so that its test binary holds no nats-server: a
// fuzzing binary instruments every package it links, and with the server's
// code linked in each execution spent most of its time on coverage counters
// (under 1,000 executions a second, against several thousand here).
package answerfuzz

import (
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// FuzzAnswer feeds arbitrary request bytes to Answer. Whatever comes in,
// nothing is answered that nats-io/jwt does not itself decode and verify as an
// authorization request, and nothing panics.
func FuzzAnswer(f *testing.F) {
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = is.Close() })
	res := verifiertest.Resolver(f, is, "prod", "tenant")
	signer, err := callout.GenerateSigner(nkeys.PrefixByteAccount)
	if err != nil {
		f.Fatal(err)
	}
	serverKP, _ := nkeys.CreateServer()
	serverPub, _ := serverKP.PublicKey()
	userKP, _ := nkeys.CreateUser()
	userPub, _ := userKP.PublicKey()
	tok, err := is.Token(kubeissuer.Pod{NodeName: "node-f"}, 0)
	if err != nil {
		f.Fatal(err)
	}
	c := jwt.NewAuthorizationRequestClaims(signer.Public())
	c.Audience = callout.RequestAudience
	c.UserNkey = userPub
	c.Server = jwt.ServerID{Name: "A", ID: serverPub}
	c.ConnectOptions.Token = tok
	c.Expires = time.Now().Add(time.Hour).Unix()
	genuine, err := c.Encode(serverKP)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(genuine))
	f.Add([]byte(genuine[:len(genuine)-4] + "AAAA"))
	f.Add([]byte("a.b.c"))
	f.Add([]byte("e30.e30.e30"))
	cfg := callout.Config{Mode: callout.ModeServerConfig, Resolver: res, ResponseSigner: signer, Account: "RUNNERS", Workers: 1}
	// The genuine seed must be answered, or the target fuzzes refusals only.
	r, err := callout.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	if resp, ev := r.Answer(f.Context(), "", []byte(genuine)); resp == nil || ev.Outcome != callout.OutcomeAuthorized {
		f.Fatalf("the genuine request: outcome %s (%s)", ev.Outcome, ev.Reason)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// A responder per input: each answers its user nkey once, and the
		// genuine seed is to be answered every time it comes.
		r, err := callout.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		resp, ev := r.Answer(t.Context(), "", data)
		if resp == nil {
			if ev.Outcome != callout.OutcomeDropped && ev.Outcome != callout.OutcomeError {
				t.Fatalf("no answer, outcome %s", ev.Outcome)
			}
			return
		}
		if _, err := jwt.DecodeAuthorizationRequestClaims(string(data)); err != nil {
			t.Fatalf("answered (%s) a request the library refuses: %v", ev.Outcome, err)
		}
	})
}
