package callout

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// fixture is a real issuer and verifier plus the keys of a server-config
// callout and of the "server" whose requests it answers.
type fixture struct {
	issuer    *kubeissuer.Issuer
	resolver  *verifier.Resolver
	signer    *Signer
	serverKP  nkeys.KeyPair
	serverPub string
	serverX   nkeys.KeyPair // the server's curve key
	serverXP  string
	xkey      *XKey
	xkeyPub   string
	now       time.Time
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Close() })
	f := &fixture{issuer: is, resolver: verifiertest.Resolver(t, is, "prod", "tenant"), now: time.Now()}
	f.signer, _ = newAccountSigner(t)
	f.serverKP, _ = nkeys.CreateServer()
	f.serverPub, _ = f.serverKP.PublicKey()
	f.serverX, _ = nkeys.CreateCurveKeys()
	f.serverXP, _ = f.serverX.PublicKey()
	f.xkey, _ = GenerateXKey()
	f.xkeyPub = f.xkey.Public()
	return f
}

func (f *fixture) responder(t testing.TB, sealed bool, mod func(*Config)) *Responder {
	t.Helper()
	cfg := Config{Mode: ModeServerConfig, Resolver: f.resolver, ResponseSigner: f.signer, Account: "RUNNERS"}
	if sealed {
		cfg.XKey = f.xkey
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) token(t testing.TB, node string, lifetime time.Duration) string {
	t.Helper()
	tok, err := f.issuer.Token(kubeissuer.Pod{NodeName: node}, lifetime)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// request builds an authorization request as the server does. mod edits the
// claims before they are signed.
func (f *fixture) request(t testing.TB, token string, mod func(*jwt.AuthorizationRequestClaims)) (*jwt.AuthorizationRequestClaims, string) {
	t.Helper()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	c := jwt.NewAuthorizationRequestClaims(f.signer.Public())
	c.Audience = RequestAudience
	c.UserNkey = upub
	c.Server = jwt.ServerID{Name: "A", ID: f.serverPub, XKey: f.serverXP}
	c.ConnectOptions.Token = token
	c.Expires = time.Now().Add(2 * time.Second).Unix()
	if mod != nil {
		mod(c)
	}
	enc, err := c.Encode(f.serverKP)
	if err != nil {
		t.Fatal(err)
	}
	return c, enc
}

func (f *fixture) seal(t testing.TB, req string) []byte {
	t.Helper()
	out, err := f.serverX.Seal([]byte(req), f.xkeyPub)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// authorized asks r, unsealed, to authorize tok and returns the user JWT
// of its answer; any other outcome fails the test.
func (f *fixture) authorized(t testing.TB, r *Responder, tok string) *jwt.UserClaims {
	t.Helper()
	_, req := f.request(t, tok, nil)
	resp, ev := r.Answer(t.Context(), "", []byte(req))
	if ev.Outcome != OutcomeAuthorized {
		t.Fatalf("outcome %s (%s)", ev.Outcome, ev.Reason)
	}
	uc, err := jwt.DecodeUserClaims(f.open(t, resp, false).Jwt)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// open decodes an answer as the server does.
func (f *fixture) open(t testing.TB, resp []byte, sealed bool) *jwt.AuthorizationResponseClaims {
	t.Helper()
	if sealed {
		if strings.HasPrefix(string(resp), "eyJ") {
			t.Fatal("answer to a sealed request is not sealed")
		}
		var err error
		if resp, err = f.serverX.Open(resp, f.xkeyPub); err != nil {
			t.Fatalf("server cannot open the answer: %v", err)
		}
	}
	rc, err := jwt.DecodeAuthorizationResponseClaims(string(resp))
	if err != nil {
		t.Fatal(err)
	}
	vr := jwt.CreateValidationResults()
	rc.Validate(vr)
	if len(vr.Issues) > 0 {
		t.Fatalf("answer does not validate: %v", vr.Issues[0])
	}
	return rc
}

func TestAnswerAuthorizesRunner(t *testing.T) {
	f := newFixture(t)
	for _, sealed := range []bool{false, true} {
		t.Run(fmt.Sprintf("sealed=%v", sealed), func(t *testing.T) {
			r := f.responder(t, sealed, nil)
			tok := f.token(t, "ip-10-0-1-5.ec2.internal", 600*time.Second)
			claims, req := f.request(t, tok, nil)
			data, hdr := []byte(req), ""
			if sealed {
				data, hdr = f.seal(t, req), f.serverXP
			}
			resp, ev := r.Answer(t.Context(), hdr, data)
			if ev.Outcome != OutcomeAuthorized {
				t.Fatalf("outcome %s (%s)", ev.Outcome, ev.Reason)
			}
			if !ev.RequestExpiry.Equal(time.Unix(claims.Expires, 0)) {
				t.Fatalf("event request expiry %v, want the request's exp %v", ev.RequestExpiry, time.Unix(claims.Expires, 0))
			}
			rc := f.open(t, resp, sealed)
			if rc.Subject != claims.UserNkey || rc.Audience != f.serverPub || rc.Issuer != f.signer.Public() || rc.Error != "" {
				t.Fatalf("response sub=%s aud=%s iss=%s err=%q", rc.Subject, rc.Audience, rc.Issuer, rc.Error)
			}
			uc, err := jwt.DecodeUserClaims(rc.Jwt)
			if err != nil {
				t.Fatal(err)
			}
			const id = "prod/ip-10-0-1-5_ec2_internal"
			want, _ := RunnerPermissions(id)
			switch {
			case uc.Subject != claims.UserNkey:
				t.Fatalf("user JWT subject %s", uc.Subject)
			case uc.Name != id:
				t.Fatalf("user JWT name %q", uc.Name)
			case uc.Audience != "RUNNERS":
				t.Fatalf("user JWT audience %q", uc.Audience)
			case uc.Issuer != f.signer.Public() || uc.IssuerAccount != "":
				t.Fatalf("user JWT issuer %s / %s", uc.Issuer, uc.IssuerAccount)
			case !reflect.DeepEqual(uc.Permissions, want):
				t.Fatalf("permissions %+v, want %+v", uc.Permissions, want)
			case !reflect.DeepEqual([]string(uc.AllowedConnectionTypes), []string{jwt.ConnectionTypeStandard}):
				t.Fatalf("allowed connection types %v, want STANDARD only", uc.AllowedConnectionTypes)
			case uc.Limits.Subs != 4 || uc.Limits.Payload != 64<<10:
				t.Fatalf("limits: %d subscriptions, %d bytes of payload; want 4 and 64 KiB", uc.Limits.Subs, uc.Limits.Payload)
			case uc.Expires == 0 || uc.Expires > time.Now().Add(600*time.Second).Unix():
				t.Fatalf("user JWT exp %d", uc.Expires)
			case ev.RunnerID != id || ev.Cluster != "prod":
				t.Fatalf("event %+v", ev)
			}
		})
	}
}

func TestAnswerCapsLifetime(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, func(c *Config) { c.MaxLifetime = 30 * time.Second })
	tok := f.token(t, "node-a", 600*time.Second)
	uc := f.authorized(t, r, tok)
	if d := time.Until(time.Unix(uc.Expires, 0)); d > 30*time.Second || d < 25*time.Second {
		t.Fatalf("user JWT lives %s, want about the 30 s cap", d)
	}
}

// A token past its exp but inside the verifier's leeway is honoured, as the
// door honours it, and its user JWT ends when the leeway does: exp + Leeway.
func TestAnswerInsideLeeway(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, nil)
	claims := f.issuer.Claims(kubeissuer.Pod{NodeName: "node-b"}, 600*time.Second)
	exp := time.Now().Add(-10 * time.Second).Unix()
	claims["exp"], claims["iat"] = exp, exp-500
	tok, err := f.issuer.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	uc := f.authorized(t, r, tok)
	if want := exp + int64(verifier.Leeway/time.Second); uc.Expires != want {
		t.Fatalf("user JWT exp %d, want the token's exp plus the leeway, %d", uc.Expires, want)
	}
}

func TestAnswerRefusals(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, nil)
	claims := f.issuer.Claims(kubeissuer.Pod{NodeName: "node-b"}, 600*time.Second)
	claims["exp"] = time.Now().Add(-verifier.Leeway - 10*time.Second).Unix() // past the 60 s leeway
	claims["iat"] = time.Now().Add(-500 * time.Second).Unix()
	pastLeeway, err := f.issuer.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	wrongAud := f.issuer.Claims(kubeissuer.Pod{NodeName: "node-b"}, 0)
	wrongAud["aud"] = []string{"other"}
	wrongAudTok, _ := f.issuer.Sign(wrongAud)
	for _, tc := range []struct {
		name, token string
		cause       error
	}{
		{"token past exp plus the leeway", pastLeeway, verifier.ErrUnauthenticated},
		{"wrong audience", wrongAudTok, verifier.ErrUnauthenticated},
		{"no token", "", errNoToken},
		{"unknown minted token", "bm90LWEtdG9rZW4tYnV0LWxvbmctZW5vdWdoLXRvLWxvb2stbGlrZS1vbmU", verifier.ErrTokenNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, req := f.request(t, tc.token, nil)
			resp, ev := r.Answer(t.Context(), "", []byte(req))
			if ev.Outcome != OutcomeDenied {
				t.Fatalf("outcome %s (%s)", ev.Outcome, ev.Reason)
			}
			rc := f.open(t, resp, false)
			if rc.Error != AnswerNotAuthorized || rc.Jwt != "" {
				t.Fatalf("answer error=%q jwt=%q", rc.Error, rc.Jwt)
			}
			if tc.token != "" && strings.Contains(ev.Reason, tc.token) {
				t.Fatal("cause quotes the token")
			}
			// The cause reported (and logged) is the one expected.
			if !strings.Contains(ev.Reason, causeText(tc.cause)) {
				t.Fatalf("cause %q, want %q", ev.Reason, causeText(tc.cause))
			}
		})
	}
}

func causeText(err error) string { return strings.TrimPrefix(err.Error(), "verifier: ") }

func TestAnswerKeysUnavailable(t *testing.T) {
	// The issuer holds every request until the test ends, so the kid-miss
	// fetch below cannot finish before the answer is decided (on a busy
	// machine it otherwise could, and the keys would be there).
	release := make(chan struct{})
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			h.ServeHTTP(w, r)
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer is.Close()
	defer close(release)
	rc := verifiertest.Cluster(t, is, "dark")
	// Never fetched: the verifier was not started and has no keys.
	v, err := verifier.New([]verifier.RunnerCluster{rc})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	f.resolver = verifier.NewResolver(v, nil)
	r := f.responder(t, false, nil)
	tok, _ := is.Token(kubeissuer.Pod{NodeName: "n"}, 0)
	_, req := f.request(t, tok, nil)
	// A context already at its end: the kid-miss fetch is not waited for.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	resp, ev := r.Answer(ctx, "", []byte(req))
	if ev.Outcome != OutcomeKeysUnavailable || ev.Cluster != "dark" {
		t.Fatalf("event %+v", ev)
	}
	if got := f.open(t, resp, false).Error; got != AnswerKeysUnavailable {
		t.Fatalf("answer %q", got)
	}
}

func TestAnswerDropsForgedAndReplayedRequests(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-c", 0)
	accountKP, _ := nkeys.CreateAccount()
	otherServer, _ := nkeys.CreateServer()
	otherX, _ := nkeys.CreateCurveKeys()
	otherXP, _ := otherX.PublicKey()

	type input struct {
		hdr  string
		data []byte
	}
	plain := func(mod func(*jwt.AuthorizationRequestClaims)) func(t *testing.T) input {
		return func(t *testing.T) input {
			_, req := f.request(t, tok, mod)
			return input{"", []byte(req)}
		}
	}
	sealedIn := func(mod func(*jwt.AuthorizationRequestClaims)) func(t *testing.T) input {
		return func(t *testing.T) input {
			_, req := f.request(t, tok, mod)
			return input{f.serverXP, f.seal(t, req)}
		}
	}
	for _, tc := range []struct {
		name   string
		sealed bool // responder has an xkey
		in     func(t *testing.T) input
		reason string
	}{
		{"wrong audience", false, plain(func(c *jwt.AuthorizationRequestClaims) { c.Audience = "someone-else" }), DropInvalid},
		{"expired", false, plain(func(c *jwt.AuthorizationRequestClaims) { c.Expires = time.Now().Add(-time.Second).Unix() }), DropExpired},
		{"no expiry", false, plain(func(c *jwt.AuthorizationRequestClaims) { c.Expires = 0 }), DropInvalid},
		{"not from a server key", false, func(t *testing.T) input {
			_, req := f.request(t, tok, nil)
			return input{"", []byte(testutil.ResignJWT(t, req, accountKP, nil))}
		}, DropInvalid},
		{"server ID is not the signer", false, plain(func(c *jwt.AuthorizationRequestClaims) {
			c.Server.ID, _ = otherServer.PublicKey()
		}), DropInvalid},
		{"bad signature", false, func(t *testing.T) input {
			_, req := f.request(t, tok, nil)
			return input{"", []byte(req[:len(req)-4] + "AAAA")}
		}, DropInvalid},
		{"addressed to another callout", false, func(t *testing.T) input {
			c, _ := f.request(t, tok, nil)
			other, _ := nkeys.CreateAccount()
			c.Subject, _ = other.PublicKey()
			enc, _ := c.Encode(f.serverKP)
			return input{"", []byte(enc)}
		}, DropWrongSubject},
		{"plain request with xkey configured", true, plain(nil), DropSealMismatch},
		{"sealed request without xkey", false, sealedIn(nil), DropSealMismatch},
		{"sealed to another key", true, func(t *testing.T) input {
			_, req := f.request(t, tok, nil)
			out, _ := f.serverX.Seal([]byte(req), otherXP)
			return input{f.serverXP, out}
		}, DropUndecryptable},
		{"header xkey not the signed one", true, func(t *testing.T) input {
			_, req := f.request(t, tok, nil)
			out, _ := otherX.Seal([]byte(req), f.xkeyPub)
			return input{otherXP, out}
		}, DropServerXKeyMis},
		{"oversized", false, func(t *testing.T) input {
			return input{"", make([]byte, MaxRequestBytes+1)}
		}, DropTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.responder(t, tc.sealed, nil)
			in := tc.in(t)
			resp, ev := r.Answer(t.Context(), in.hdr, in.data)
			if resp != nil || ev.Outcome != OutcomeDropped || ev.Reason != tc.reason {
				t.Fatalf("resp=%d bytes, event %s/%s, want dropped/%s", len(resp), ev.Outcome, ev.Reason, tc.reason)
			}
		})
	}

	t.Run("replayed", func(t *testing.T) {
		r := f.responder(t, false, nil)
		_, req := f.request(t, tok, nil)
		if resp, ev := r.Answer(t.Context(), "", []byte(req)); resp == nil || ev.Outcome != OutcomeAuthorized {
			t.Fatalf("first: %s (%s)", ev.Outcome, ev.Reason)
		}
		if resp, ev := r.Answer(t.Context(), "", []byte(req)); resp != nil || ev.Reason != DropReplayed {
			t.Fatalf("replay: %s (%s)", ev.Outcome, ev.Reason)
		}
	})
}

// New refuses every configuration it cannot run with one exact error, and
// takes the limits at their boundaries.
func TestNewRefusesBadConfig(t *testing.T) {
	f := newFixture(t)
	user, _ := nkeys.CreateUser()
	useed, _ := user.Seed()
	userSigner, _ := NewSigner(useed)
	acct, _ := nkeys.CreateAccount()
	acctPub, _ := acct.PublicKey()
	base := func(mod func(*Config)) Config {
		c := Config{Mode: ModeServerConfig, Resolver: f.resolver, ResponseSigner: f.signer, Account: "A"}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	op := func(mod func(*Config)) Config {
		return base(func(c *Config) {
			c.Mode, c.Account, c.UserSigner = ModeOperator, "", f.signer
			if mod != nil {
				mod(c)
			}
		})
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" when New must accept it
	}{
		{"no resolver", base(func(c *Config) { c.Resolver = nil }), "callout: config: Resolver is required"},
		{"no signer", base(func(c *Config) { c.ResponseSigner = nil }), "callout: config: ResponseSigner is required"},
		{"user key as issuer", base(func(c *Config) { c.ResponseSigner = userSigner }), "callout: config: ResponseSigner must be an account key, not user"},
		{"no account", base(func(c *Config) { c.Account = "" }), "callout: config: Account (the target account name) is required"},
		{"server-config with a user signer", base(func(c *Config) { c.UserSigner = f.signer }), "callout: config: server-config mode signs everything with the issuer; UserSigner and CalloutAccount are operator-mode settings"},
		{"server-config with a callout account", base(func(c *Config) { c.CalloutAccount = acctPub }), "callout: config: server-config mode signs everything with the issuer; UserSigner and CalloutAccount are operator-mode settings"},
		{"operator without user signer", op(func(c *Config) { c.UserSigner = nil }), "callout: config: operator mode needs UserSigner (the target account key or its signing key)"},
		{"operator with a user key as user signer", op(func(c *Config) { c.UserSigner = userSigner }), "callout: config: UserSigner must be an account key, not user"},
		{"operator with account name", op(func(c *Config) { c.Account = "RUNNERS" }), "callout: config: in operator mode Account is the target account's public key"},
		{"operator with a callout account that is no account key", op(func(c *Config) { c.CalloutAccount = "CALLOUT" }), "callout: config: CalloutAccount must be an account public key"},
		{"operator", op(nil), ""},
		{"operator with its own callout account and target", op(func(c *Config) { c.CalloutAccount, c.Account = acctPub, acctPub }), ""},
		{"lifetime too short", base(func(c *Config) { c.MaxLifetime = 2*time.Second - time.Nanosecond }), "callout: config: MaxLifetime 1.999999999s is below the minimum 2s"},
		{"lifetime at the minimum", base(func(c *Config) { c.MaxLifetime = 2 * time.Second }), ""},
		{"lifetime at the maximum", base(func(c *Config) { c.MaxLifetime = time.Hour }), ""},
		{"lifetime too long", base(func(c *Config) { c.MaxLifetime = time.Hour + time.Nanosecond }), "callout: config: MaxLifetime 1h0m0.000000001s is above the maximum 1h0m0s"},
		{"horizon too short", base(func(c *Config) { c.AnswerHorizon = MinAnswerHorizon - time.Nanosecond }), fmt.Sprintf("callout: config: AnswerHorizon %s is below the minimum %s", MinAnswerHorizon-time.Nanosecond, MinAnswerHorizon)},
		{"horizon at the minimum", base(func(c *Config) { c.AnswerHorizon = MinAnswerHorizon }), ""},
		{"no mode", base(func(c *Config) { c.Mode = 0 }), "callout: config: Mode must be ModeServerConfig or ModeOperator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("New = %v, want it accepted", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("New = %v, want %q", err, tc.want)
			}
		})
	}
}

// The replay set is shared by the workers.
func TestFirstUseConcurrent(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, nil)
	var wg sync.WaitGroup
	wins := make(chan bool, 64)
	for range 64 {
		wg.Go(func() { wins <- r.firstUse("UKEY", time.Now().Unix()+2, time.Now().Unix()) })
	}
	wg.Wait()
	close(wins)
	n := 0
	for w := range wins {
		if w {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d first uses, want 1", n)
	}
}

// oneToken is a TokenStore holding one minted token. The store refuses to
// mint a Runner ID that is a NATS user key; this stands in for a row
// written before it did.
type oneToken struct{ t verifier.MintedToken }

func (o oneToken) LookupTokenHash(context.Context, [sha256.Size]byte) (verifier.MintedToken, error) {
	return o.t, nil
}

// A Runner ID that is a NATS user key gets no user JWT: nats-server would
// show such a user like one with a key of its own, which the kicker never
// judges, so it could not be revoked while connected.
func TestAnswerRefusesARunnerIDThatIsAUserKey(t *testing.T) {
	f := newFixture(t)
	ukp, _ := nkeys.CreateUser()
	id, _ := ukp.PublicKey()
	r := f.responder(t, false, func(c *Config) {
		c.Resolver = verifier.NewResolver(nil, oneToken{verifier.MintedToken{Kind: verifier.SubjectRunner, ID: id, TokenID: "t1"}})
	})
	_, req := f.request(t, "bm90LWEtdG9rZW4tYnV0LWxvbmctZW5vdWdoLXRvLWxvb2stbGlrZS1vbmU", nil)
	resp, ev := r.Answer(t.Context(), "", []byte(req))
	if ev.Outcome == OutcomeAuthorized || !strings.Contains(ev.Reason, "runner ID is a NATS user key") {
		t.Fatalf("outcome %s (%s), want a refusal naming the user key", ev.Outcome, ev.Reason)
	}
	if rc := f.open(t, resp, false); rc.Jwt != "" {
		t.Fatal("a user JWT was issued")
	}
}
