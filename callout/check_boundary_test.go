package callout

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// The request checks at their boundaries: the size cap, nbf at and one
// second past the callout's clock, and the unverified exp read of a request
// whose header part is empty.
func TestCheckBoundaries(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-edge", 0)
	now := time.Now()
	at := func(c *Config) { c.Now = func() time.Time { return now } }

	t.Run("size cap", func(t *testing.T) {
		r := f.responder(t, false, at)
		// Exactly the cap is read (and is no JWT); one byte more is not read.
		if _, ev := r.Answer(t.Context(), "", make([]byte, MaxRequestBytes)); ev.Reason != DropInvalid {
			t.Fatalf("%d bytes: %s (%s), want dropped as %s", MaxRequestBytes, ev.Outcome, ev.Reason, DropInvalid)
		}
		if _, ev := r.Answer(t.Context(), "", make([]byte, MaxRequestBytes+1)); ev.Reason != DropTooLarge {
			t.Fatalf("%d bytes: %s (%s), want dropped as %s", MaxRequestBytes+1, ev.Outcome, ev.Reason, DropTooLarge)
		}
	})

	for _, tc := range []struct {
		name string
		nbf  int64
		want Outcome
	}{
		{"nbf in the past", now.Unix() - 10, OutcomeAuthorized},
		{"nbf now", now.Unix(), OutcomeAuthorized},
		{"nbf a second ahead", now.Unix() + 1, OutcomeDropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.responder(t, false, at)
			_, req := f.request(t, tok, func(c *jwt.AuthorizationRequestClaims) { c.NotBefore = tc.nbf })
			resp, ev := r.Answer(t.Context(), "", []byte(req))
			if ev.Outcome != tc.want || (tc.want == OutcomeDropped) != (resp == nil) {
				t.Fatalf("nbf %+d s: %s (%s), want %s", tc.nbf-now.Unix(), ev.Outcome, ev.Reason, tc.want)
			}
			if tc.want == OutcomeDropped && ev.Reason != DropInvalid {
				t.Fatalf("nbf ahead dropped as %s, want %s", ev.Reason, DropInvalid)
			}
		})
	}

	t.Run("exp read with an empty header", func(t *testing.T) {
		// ".payload.sig": the unverified read finds exp (past), so the request
		// is dropped as expired before any signature check, not as invalid.
		r := f.responder(t, false, at)
		payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"exp":%d}`, now.Unix()-5))
		if _, ev := r.Answer(t.Context(), "", []byte("."+payload+".c2ln")); ev.Reason != DropExpired {
			t.Fatalf("%s (%s), want dropped as %s", ev.Outcome, ev.Reason, DropExpired)
		}
	})
}

// The replay set forgets a user nkey once its request has expired, at the
// first use in the next second.
func TestFirstUseForgetsExpired(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, nil)
	if !r.firstUse("UA", 100, 100) || r.firstUse("UA", 100, 100) {
		t.Fatal("a user nkey is new once, then a replay")
	}
	if !r.firstUse("UK", 101, 100) {
		t.Fatal("UK is new")
	}
	if !r.firstUse("UB", 200, 101) {
		t.Fatal("UB is new")
	}
	// At 101, UA (exp 100) is gone; UK (exp 101) is not expired yet.
	_, keptA := r.replay["UA"]
	_, keptK := r.replay["UK"]
	if keptA || !keptK || len(r.replay) != 2 {
		t.Fatalf("at 101 the set holds %d keys (UA kept: %v, UK kept: %v); want UK and UB", len(r.replay), keptA, keptK)
	}
}

// In operator mode the answer and the user JWT name an issuer account
// exactly when their signing key is not that account's own key.
func TestOperatorModeIssuerAccounts(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-op", 0)
	target, _ := newAccountSigner(t)
	calloutAcct, _ := nkeys.CreateAccount()
	calloutPub, _ := calloutAcct.PublicKey()
	targetAcct, _ := nkeys.CreateAccount()
	targetPub, _ := targetAcct.PublicKey()
	for _, tc := range []struct {
		name                      string
		calloutAccount, account   string
		wantRespIssuer, wantUserI string
	}{
		{"signing with the accounts' own keys", "", "", "", ""},
		{"the callout account named as the signer's own", f.signer.Public(), target.Public(), "", ""},
		{"signing keys of other accounts", calloutPub, targetPub, calloutPub, targetPub},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.responder(t, false, func(c *Config) {
				c.Mode, c.Account, c.UserSigner, c.CalloutAccount = ModeOperator, tc.account, target, tc.calloutAccount
			})
			_, req := f.request(t, tok, func(c *jwt.AuthorizationRequestClaims) {
				if tc.calloutAccount != "" {
					c.Subject = tc.calloutAccount
				}
			})
			resp, ev := r.Answer(t.Context(), "", []byte(req))
			if ev.Outcome != OutcomeAuthorized {
				t.Fatalf("%s (%s)", ev.Outcome, ev.Reason)
			}
			rc := f.open(t, resp, false)
			uc, err := jwt.DecodeUserClaims(rc.Jwt)
			if err != nil {
				t.Fatal(err)
			}
			if rc.IssuerAccount != tc.wantRespIssuer || uc.IssuerAccount != tc.wantUserI {
				t.Fatalf("answer issuer_account %q, user JWT issuer_account %q; want %q and %q", rc.IssuerAccount, uc.IssuerAccount, tc.wantRespIssuer, tc.wantUserI)
			}
		})
	}
}
