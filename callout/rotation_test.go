package callout

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// serverGen is the auth_callout configuration one NATS server runs during a
// roll: the xkey it seals to ("" when plain) and the keys it accepts.
type serverGen struct {
	xkey       *XKey   // the callout xkey in the server's configuration
	issuer     *Signer // the answer's and, in server-config mode, the user JWT's signer it expects
	userSigner *Signer // operator mode: the Runners' signing key its account JWT lists
}

// ask sends a request from a server of generation g, as nats-server does,
// and checks the answer as that server would: opened with the xkey it
// sealed to, signed by the issuer it names (server/auth_callout.go's
// decodeResponse and getIssuerAccount). It returns the event and the
// decoded user JWT.
func (f *fixture) ask(t *testing.T, r *Responder, g serverGen, subject, token string) (Event, *jwt.UserClaims) {
	t.Helper()
	_, req := f.request(t, token, func(c *jwt.AuthorizationRequestClaims) { c.Subject = subject })
	data, hdr := []byte(req), ""
	if g.xkey != nil {
		var err error
		if data, err = f.serverX.Seal([]byte(req), g.xkey.Public()); err != nil {
			t.Fatal(err)
		}
		hdr = f.serverXP
	}
	resp, ev := r.Answer(t.Context(), hdr, data)
	if resp == nil {
		return ev, nil
	}
	if g.xkey != nil {
		opened, err := f.serverX.Open(resp, g.xkey.Public())
		if err != nil {
			t.Fatalf("the server cannot open the answer with the xkey it sealed to (%s): %v", g.xkey.Public(), err)
		}
		resp = opened
	}
	rc, err := jwt.DecodeAuthorizationResponseClaims(string(resp))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Issuer != g.issuer.Public() {
		t.Fatalf("answer signed by %s, the server expects %s", rc.Issuer, g.issuer.Public())
	}
	if rc.Error != "" {
		return ev, nil
	}
	uc, err := jwt.DecodeUserClaims(rc.Jwt)
	if err != nil {
		t.Fatal(err)
	}
	return ev, uc
}

func newXKey(t *testing.T) *XKey {
	t.Helper()
	x, err := GenerateXKey()
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// In server-config mode a callout holding the next xkey, the next issuer or
// both answers a server of either configuration with that server's keys:
// the xkey its request opened with and the issuer its subject names. A
// server configured with neither is not answered.
func TestRotationAnswersEachServerWithItsKeys(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-rot", 0)
	for _, tc := range []struct {
		name             string
		nextX, nextIssue bool
	}{
		{"xkey", true, false},
		{"issuer", false, true},
		{"xkey and issuer", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := serverGen{xkey: newXKey(t), issuer: f.signer}
			next, n := old, &NextKeys{}
			if tc.nextX {
				n.XKey = newXKey(t)
				next.xkey = n.XKey
			}
			if tc.nextIssue {
				n.ResponseSigner, _ = newAccountSigner(t)
				next.issuer = n.ResponseSigner
			}
			r := f.responder(t, true, func(c *Config) { c.XKey, c.Next = old.xkey, n })
			for _, g := range []struct {
				name string
				gen  serverGen
			}{{"old", old}, {"new", next}} {
				ev, uc := f.ask(t, r, g.gen, g.gen.issuer.Public(), tok)
				if ev.Outcome != OutcomeAuthorized || uc == nil {
					t.Fatalf("%s server: %s (%s)", g.name, ev.Outcome, ev.Reason)
				}
				if uc.Issuer != g.gen.issuer.Public() || uc.IssuerAccount != "" {
					t.Fatalf("%s server: user JWT signed by %s (issuer_account %q), the server accepts %s alone", g.name, uc.Issuer, uc.IssuerAccount, g.gen.issuer.Public())
				}
				if ev.XKey != g.gen.xkey.Public() || ev.Issuer != g.gen.issuer.Public() || ev.UserIssuer != g.gen.issuer.Public() {
					t.Fatalf("%s server: event names xkey %s, issuer %s, user issuer %s", g.name, ev.XKey, ev.Issuer, ev.UserIssuer)
				}
			}
			stranger, _ := newAccountSigner(t)
			for _, g := range []struct {
				name, subject string
				gen           serverGen
				want          string
			}{
				{"sealed to a third xkey", old.issuer.Public(), serverGen{xkey: newXKey(t), issuer: old.issuer}, DropUndecryptable},
				{"addressed to a third issuer", stranger.Public(), serverGen{xkey: old.xkey, issuer: stranger}, DropWrongSubject},
			} {
				ev, _ := f.ask(t, r, g.gen, g.subject, tok)
				if ev.Outcome != OutcomeDropped || ev.Reason != g.want {
					t.Fatalf("%s: %s (%s), want dropped as %s", g.name, ev.Outcome, ev.Reason, g.want)
				}
			}
		})
	}
}

// Without the next keys, the callout drops what a server on the new
// configuration asks: the failure the rotation exists to avoid.
func TestWithoutNextKeysTheNewServersAreDropped(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-norot", 0)
	old := serverGen{xkey: newXKey(t), issuer: f.signer}
	r := f.responder(t, true, func(c *Config) { c.XKey = old.xkey })
	newIssuer, _ := newAccountSigner(t)
	for _, tc := range []struct {
		name string
		gen  serverGen
		want string
	}{
		{"new xkey", serverGen{xkey: newXKey(t), issuer: old.issuer}, DropUndecryptable},
		{"new issuer", serverGen{xkey: old.xkey, issuer: newIssuer}, DropWrongSubject},
	} {
		ev, _ := f.ask(t, r, tc.gen, tc.gen.issuer.Public(), tok)
		if ev.Outcome != OutcomeDropped || ev.Reason != tc.want {
			t.Fatalf("%s: %s (%s), want dropped as %s", tc.name, ev.Outcome, ev.Reason, tc.want)
		}
	}
}

// In operator mode the request's subject is the callout account in both
// configurations; the xkey it opened with picks the generation whose signers
// answer: the callout account's signing key and the Runners' signing key
// that server's account JWTs list.
func TestRotationInOperatorModeFollowsTheXKey(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-op-rot", 0)
	authAcct, _ := nkeys.CreateAccount()
	authPub, _ := authAcct.PublicKey()
	runnersAcct, _ := nkeys.CreateAccount()
	runnersPub, _ := runnersAcct.PublicKey()
	ask1, _ := newAccountSigner(t)
	ask2, _ := newAccountSigner(t)
	rsk1, _ := newAccountSigner(t)
	rsk2, _ := newAccountSigner(t)
	old := serverGen{xkey: newXKey(t), issuer: ask1, userSigner: rsk1}
	next := serverGen{xkey: newXKey(t), issuer: ask2, userSigner: rsk2}
	r := f.responder(t, true, func(c *Config) {
		c.Mode, c.ResponseSigner, c.CalloutAccount, c.UserSigner, c.Account, c.XKey = ModeOperator, ask1, authPub, rsk1, runnersPub, old.xkey
		c.Next = &NextKeys{XKey: next.xkey, ResponseSigner: ask2, UserSigner: rsk2}
	})
	for _, g := range []struct {
		name string
		gen  serverGen
	}{{"old", old}, {"new", next}, {"old again", old}} {
		ev, uc := f.ask(t, r, g.gen, authPub, tok)
		if ev.Outcome != OutcomeAuthorized || uc == nil {
			t.Fatalf("%s server: %s (%s)", g.name, ev.Outcome, ev.Reason)
		}
		if uc.Issuer != g.gen.userSigner.Public() || uc.IssuerAccount != runnersPub || uc.Audience != runnersPub {
			t.Fatalf("%s server: user JWT signed by %s for %s (audience %s); want %s for %s", g.name, uc.Issuer, uc.IssuerAccount, uc.Audience, g.gen.userSigner.Public(), runnersPub)
		}
		if ev.XKey != g.gen.xkey.Public() || ev.UserIssuer != g.gen.userSigner.Public() {
			t.Fatalf("%s server: event names xkey %s, user issuer %s", g.name, ev.XKey, ev.UserIssuer)
		}
	}
	if got := r.RunnerIssuers(); len(got) != 2 || got[0] != rsk1.Public() || got[1] != rsk2.Public() {
		t.Fatalf("RunnerIssuers = %v, want both Runners' signing keys, current first", got)
	}
	held := r.HeldKeys()
	for role, want := range map[string][]string{
		KeyRoleXKey:       {old.xkey.Public(), next.xkey.Public()},
		KeyRoleIssuer:     {ask1.Public(), ask2.Public()},
		KeyRoleUserSigner: {rsk1.Public(), rsk2.Public()},
	} {
		if strings.Join(held[role], ",") != strings.Join(want, ",") {
			t.Fatalf("HeldKeys[%s] = %v, want %v", role, held[role], want)
		}
	}
}

// An operator-mode rotation of the xkey alone keeps the signers, and the
// answers carry issuer_account exactly when a signing key signs.
func TestOperatorXKeyRotationKeepsTheSigners(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-op-x", 0)
	target, _ := newAccountSigner(t)
	old := serverGen{xkey: newXKey(t), issuer: f.signer, userSigner: target}
	next := serverGen{xkey: newXKey(t), issuer: f.signer, userSigner: target}
	r := f.responder(t, true, func(c *Config) {
		c.Mode, c.UserSigner, c.Account, c.XKey, c.Next = ModeOperator, target, "", old.xkey, &NextKeys{XKey: next.xkey}
	})
	for _, g := range []serverGen{old, next} {
		ev, uc := f.ask(t, r, g, f.signer.Public(), tok)
		if ev.Outcome != OutcomeAuthorized || uc == nil {
			t.Fatalf("%s (%s)", ev.Outcome, ev.Reason)
		}
		if uc.Issuer != target.Public() || uc.IssuerAccount != "" || ev.XKey != g.xkey.Public() {
			t.Fatalf("user JWT signed by %s (issuer_account %q), xkey %s", uc.Issuer, uc.IssuerAccount, ev.XKey)
		}
	}
	if got := r.RunnerIssuers(); len(got) != 1 || got[0] != target.Public() {
		t.Fatalf("RunnerIssuers = %v, want the one account", got)
	}
}

// New refuses next keys that cannot work, each with its reason.
func TestNewRefusesBadNextKeys(t *testing.T) {
	f := newFixture(t)
	x1, x2 := newXKey(t), newXKey(t)
	i2, _ := newAccountSigner(t)
	target, _ := newAccountSigner(t)
	u2, _ := newAccountSigner(t)
	op, _ := nkeys.CreateOperator()
	opSeed, _ := op.Seed()
	opSigner, err := NewSigner(opSeed)
	if err != nil {
		t.Fatal(err)
	}
	operator := func(c *Config) { c.Mode, c.UserSigner, c.Account = ModeOperator, target, "" }
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"empty", func(c *Config) { c.Next = &NextKeys{} }, "Next holds no key"},
		{"next xkey without a current one", func(c *Config) { c.XKey, c.Next = nil, &NextKeys{XKey: x2} }, "a next xkey needs a current one"},
		{"next xkey is the current one", func(c *Config) { c.XKey, c.Next = x1, &NextKeys{XKey: x1} }, "the next xkey is the current one"},
		{"next issuer not an account", func(c *Config) { c.Next = &NextKeys{ResponseSigner: opSigner} }, "the next response signer must be an account key"},
		{"next issuer is the current one", func(c *Config) { c.Next = &NextKeys{ResponseSigner: f.signer} }, "the next response signer is the current one"},
		{"user signer in server-config mode", func(c *Config) { c.Next = &NextKeys{UserSigner: u2} }, "a next UserSigner is an operator-mode setting"},
		{"next user signer not an account", func(c *Config) { operator(c); c.XKey, c.Next = x1, &NextKeys{XKey: x2, UserSigner: opSigner} }, "the next user signer must be an account key"},
		{"next user signer is the current one", func(c *Config) { operator(c); c.XKey, c.Next = x1, &NextKeys{XKey: x2, UserSigner: target} }, "the next user signer is the current one"},
		{"operator signing keys without a next xkey", func(c *Config) { operator(c); c.XKey, c.Next = x1, &NextKeys{ResponseSigner: i2} }, "by the xkey it is sealed to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Mode: ModeServerConfig, Resolver: f.resolver, ResponseSigner: f.signer, Account: "RUNNERS"}
			tc.mod(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "callout: config: ") {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// Each alone is accepted where it can work.
	for _, n := range []*NextKeys{{XKey: x2}, {ResponseSigner: i2}, {XKey: x2, ResponseSigner: i2}} {
		if _, err := New(Config{Mode: ModeServerConfig, Resolver: f.resolver, ResponseSigner: f.signer, Account: "RUNNERS", XKey: x1, Next: n}); err != nil {
			t.Fatalf("New with %+v: %v", n, err)
		}
	}
}

// ServeConfig.Check refuses the next-key flags where they cannot work, and
// names the flags.
func TestServeConfigCheckNextKeys(t *testing.T) {
	base := func(mod func(*ServeConfig)) ServeConfig {
		c := ServeConfig{Mode: ModeServerConfig, IssuerSeedFile: "i", Account: "RUNNERS", RunnerClusters: "c", NoKick: true, XKeySeedFile: "x"}
		mod(&c)
		return c
	}
	op := func(c *ServeConfig) { c.Mode, c.Account, c.UserSeedFile = ModeOperator, "", "u" }
	for _, tc := range []struct {
		name string
		cfg  ServeConfig
		want string
	}{
		{"next xkey, no xkey", base(func(c *ServeConfig) { c.XKeySeedFile, c.NextXKeySeedFile = "", "x2"; c.NATSURLs = "tls://nats:4222" }), "--next-xkey-seed-file needs --xkey-seed-file"},
		{"next user signer in server-config mode", base(func(c *ServeConfig) { c.NextUserSeedFile = "u2" }), "--next-user-signing-seed-file is an operator-mode flag"},
		{"operator next issuer, no next xkey", base(func(c *ServeConfig) { op(c); c.NextIssuerSeedFile = "i2" }), "needs --next-xkey-seed-file"},
		{"operator next user signer, no next xkey", base(func(c *ServeConfig) { op(c); c.NextUserSeedFile = "u2" }), "needs --next-xkey-seed-file"},
		{"next xkey file is the current", base(func(c *ServeConfig) { c.NextXKeySeedFile = "x" }), "a --next-* seed file is the current one"},
		{"next issuer file is the current", base(func(c *ServeConfig) { c.NextIssuerSeedFile = "i" }), "a --next-* seed file is the current one"},
		{"next user file is the current", base(func(c *ServeConfig) { op(c); c.NextXKeySeedFile, c.NextUserSeedFile = "x2", "u" }), "a --next-* seed file is the current one"},
		{"server-config xkey and issuer", base(func(c *ServeConfig) { c.NextXKeySeedFile, c.NextIssuerSeedFile = "x2", "i2" }), ""},
		{"server-config issuer alone", base(func(c *ServeConfig) { c.NextIssuerSeedFile = "i2" }), ""},
		{"operator, all three", base(func(c *ServeConfig) {
			op(c)
			c.NextXKeySeedFile, c.NextIssuerSeedFile, c.NextUserSeedFile = "x2", "i2", "u2"
		}), ""},
		{"operator, xkey alone", base(func(c *ServeConfig) { op(c); c.NextXKeySeedFile = "x2" }), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v, want nil", err)
			case tc.want != "" && (err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: %v, want ErrConfig containing %q", err, tc.want)
			}
		})
	}
}

// compass_callout_key_answers_total counts answers by the xkey and the
// issuer that made them, and shows every held key from the start.
func TestKeyAnswersCountEachKey(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, func() int64 { return 0 }, func() time.Duration { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	m.HoldKeys(map[string][]string{KeyRoleXKey: {"X1", "X2"}, KeyRoleIssuer: {"A1", "A2"}, KeyRoleUserSigner: {"U1"}})
	for _, ev := range []Event{
		{Outcome: OutcomeAuthorized, XKey: "X2", Issuer: "A1", UserIssuer: "A1"},
		{Outcome: OutcomeDenied, XKey: "X2", Issuer: "A1"},
		{Outcome: OutcomeKeysUnavailable, Issuer: "A2"},
		{Outcome: OutcomeDropped, XKey: "X1", Issuer: "A1"}, // not answered: not counted
		{Outcome: OutcomeError, XKey: "X1", Issuer: "A1"},   // not answered: not counted
	} {
		m.Observe(ev)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "compass_callout_key_answers_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range mt.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			got[fmt.Sprintf("%s=%s", l["role"], l["key"])] = mt.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"xkey=X1": 0, "xkey=X2": 2, "issuer=A1": 2, "issuer=A2": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("compass_callout_key_answers_total = %v, want %v", got, want)
	}
}
