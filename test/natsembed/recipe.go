package natsembed

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/kick"
)

// Recipe is operator mode as deploy/nats/README.md makes it with nsc, made
// here with nats-io/jwt (nsc is not among the tools CI builds): an operator
// that requires signing keys, the accounts SYS, AUTH and RUNNERS, and in
// each account two kinds of signing key. The users an operator makes
// (compass-callout and the sentinel in AUTH, compass-server in RUNNERS,
// compass-kick in SYS) are signed by a key kept for good; the callout's own
// keys (AUTH's signing key for its answers, RUNNERS' for the Runners' user
// JWTs, and the xkey) are the ones a rotation replaces. The seeds are test
// keys: nothing here is logged.
type Recipe struct {
	operator, operatorSigning            nkeys.KeyPair
	sys, auth, runners                   nkeys.KeyPair
	sysUsers, authUsers, runnersUsers    nkeys.KeyPair
	calloutUser, serverUser, kickUser    nkeys.KeyPair
	OperatorJWT, SysPub, AuthPub         string
	RunnersPub, CalloutUserPub           string
	sentinel                             string
	calloutCreds, serverCreds, kickCreds []byte
}

// CalloutKeys are the keys compass-callout holds in operator mode, which
// one rotation replaces together: the xkey, AUTH's signing key for the
// answers (--issuer-seed-file) and RUNNERS' for the user JWTs
// (--user-signing-seed-file).
type CalloutKeys struct {
	XKey, Issuer, UserSigning nkeys.KeyPair
}

// Seeds returns the three seeds, as the callout's Secrets hold them.
func (k CalloutKeys) Seeds(t testing.TB) (xkey, issuer, userSigning []byte) {
	t.Helper()
	return seedOf(t, k.XKey), seedOf(t, k.Issuer), seedOf(t, k.UserSigning)
}

// Pubs returns the three public keys.
func (k CalloutKeys) Pubs(t testing.TB) (xkey, issuer, userSigning string) {
	t.Helper()
	return PubOf(t, k.XKey), PubOf(t, k.Issuer), PubOf(t, k.UserSigning)
}

// NewRecipe makes the operator, the accounts' keys, the users and the
// sentinel; the callout's keys come from NewCalloutKeys, and the account
// JWTs that list them from Resolver.
func NewRecipe(t testing.TB) *Recipe {
	t.Helper()
	r := &Recipe{}
	r.operator, _ = NewKey(t, nkeys.CreateOperator)
	r.operatorSigning, _ = NewKey(t, nkeys.CreateOperator)
	r.sys, r.SysPub = NewKey(t, nkeys.CreateAccount)
	r.auth, r.AuthPub = NewKey(t, nkeys.CreateAccount)
	r.runners, r.RunnersPub = NewKey(t, nkeys.CreateAccount)
	r.sysUsers, _ = NewKey(t, nkeys.CreateAccount)
	r.authUsers, _ = NewKey(t, nkeys.CreateAccount)
	r.runnersUsers, _ = NewKey(t, nkeys.CreateAccount)
	r.calloutUser, r.CalloutUserPub = NewKey(t, nkeys.CreateUser)
	r.serverUser, _ = NewKey(t, nkeys.CreateUser)
	r.kickUser, _ = NewKey(t, nkeys.CreateUser)

	// nsc add operator --generate-signing-key --sys; nsc edit operator
	// --require-signing-keys.
	oc := jwt.NewOperatorClaims(PubOf(t, r.operator))
	oc.Name = "compass"
	oc.StrictSigningKeyUsage = true
	oc.SigningKeys.Add(PubOf(t, r.operatorSigning))
	oc.SystemAccount = r.SysPub
	r.OperatorJWT = encodeClaims(t, oc, r.operator)

	r.calloutCreds = r.creds(t, r.calloutUser, "compass-callout", r.authUsers, r.AuthPub, nil)
	r.serverCreds = r.creds(t, r.serverUser, "compass-server", r.runnersUsers, r.RunnersPub, nil)
	r.kickCreds = r.creds(t, r.kickUser, "compass-kick", r.sysUsers, r.SysPub, func(uc *jwt.UserClaims) {
		uc.Pub.Allow.Add(kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick)
		uc.Sub.Allow.Add("_INBOX.>")
		uc.Sub.Allow.Add(kick.EventSubjects(r.RunnersPub)...)
	})
	// nsc add user --account AUTH --name sentinel --bearer --deny-pubsub '>'
	_, spub := NewKey(t, nkeys.CreateUser)
	sc := jwt.NewUserClaims(spub)
	sc.Name = "sentinel"
	sc.BearerToken = true
	sc.IssuerAccount = r.AuthPub
	sc.Pub.Deny.Add(">")
	sc.Sub.Deny.Add(">")
	r.sentinel = encodeClaims(t, sc, r.authUsers)
	return r
}

// NewCalloutKeys makes a set of the callout's keys (nk -gen curve, and
// nsc edit account --sk generate for AUTH and RUNNERS).
func NewCalloutKeys(t testing.TB) CalloutKeys {
	t.Helper()
	x, _ := NewKey(t, nkeys.CreateCurveKeys)
	i, _ := NewKey(t, nkeys.CreateAccount)
	u, _ := NewKey(t, nkeys.CreateAccount)
	return CalloutKeys{XKey: x, Issuer: i, UserSigning: u}
}

// Sentinel is the sentinel's user JWT (nsc describe user --account AUTH
// --name sentinel --raw).
func (r *Recipe) Sentinel() string { return r.sentinel }

// CalloutCreds, ServerCreds and KickCreds are the .creds files of
// compass-callout, compass-server and compass-kick (nsc generate creds).
func (r *Recipe) CalloutCreds() []byte { return r.calloutCreds }

// ServerCreds is compass-server's .creds file.
func (r *Recipe) ServerCreds() []byte { return r.serverCreds }

// KickCreds is compass-kick's .creds file.
func (r *Recipe) KickCreds() []byte { return r.kickCreds }

// Resolver is what nsc generate config --mem-resolver writes when AUTH's
// and RUNNERS' JWTs list the kept users' key and the callout's keys in
// keys (one set, or the current and the next while a rotation adds the
// next before it removes the current), AUTH's authorization block naming
// compass-callout, RUNNERS and xkey: the operator, the system account and
// every account JWT, preloaded into a memory resolver.
func (r *Recipe) Resolver(t testing.TB, xkey nkeys.KeyPair, keys ...CalloutKeys) string {
	t.Helper()
	sc := jwt.NewAccountClaims(r.SysPub)
	sc.Name = "SYS"
	sc.SigningKeys.Add(PubOf(t, r.sysUsers))
	ac := jwt.NewAccountClaims(r.AuthPub)
	ac.Name = "AUTH"
	ac.SigningKeys.Add(PubOf(t, r.authUsers))
	rc := jwt.NewAccountClaims(r.RunnersPub)
	rc.Name = "RUNNERS"
	rc.SigningKeys.Add(PubOf(t, r.runnersUsers))
	for _, k := range keys {
		ac.SigningKeys.Add(PubOf(t, k.Issuer))
		rc.SigningKeys.Add(PubOf(t, k.UserSigning))
	}
	ac.EnableExternalAuthorization(r.CalloutUserPub)
	ac.Authorization.AllowedAccounts.Add(r.RunnersPub)
	ac.Authorization.XKey = PubOf(t, xkey)
	accounts := map[string][2]string{
		r.SysPub:     {"SYS", encodeClaims(t, sc, r.operatorSigning)},
		r.AuthPub:    {"AUTH", encodeClaims(t, ac, r.operatorSigning)},
		r.RunnersPub: {"RUNNERS", encodeClaims(t, rc, r.operatorSigning)},
	}
	pubs := make([]string, 0, len(accounts))
	for p := range accounts {
		pubs = append(pubs, p)
	}
	sort.Strings(pubs)
	var b strings.Builder
	fmt.Fprintf(&b, "# Operator named compass\noperator: %s\n\n# System Account named SYS\nsystem_account: %s\n\n", r.OperatorJWT, r.SysPub)
	b.WriteString("# configuration of the nats based resolver\nresolver: MEMORY\n\nresolver_preload: {\n")
	for _, p := range pubs {
		fmt.Fprintf(&b, "\t# Account %q\n\t%s: %s\n\n", accounts[p][0], p, accounts[p][1])
	}
	b.WriteString("}\n")
	return b.String()
}

func (r *Recipe) creds(t testing.TB, user nkeys.KeyPair, name string, signer nkeys.KeyPair, account string, mod func(*jwt.UserClaims)) []byte {
	t.Helper()
	uc := jwt.NewUserClaims(PubOf(t, user))
	uc.Name = name
	uc.IssuerAccount = account
	if mod != nil {
		mod(uc)
	}
	b, err := jwt.FormatUserConfig(encodeClaims(t, uc, signer), seedOf(t, user))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// PubOf is kp's public key.
func PubOf(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func seedOf(t testing.TB, kp nkeys.KeyPair) []byte {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return seed
}

func encodeClaims(t testing.TB, c interface {
	Encode(nkeys.KeyPair) (string, error)
}, kp nkeys.KeyPair) string {
	t.Helper()
	s, err := c.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
