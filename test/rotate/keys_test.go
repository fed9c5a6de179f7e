package rotate

// The two key generations of a rotation and the nats-server configuration
// each makes, in both auth modes.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/test/natsembed"
)

// seed is one key: its seed in a file for the callout, its public key for
// the servers' configuration.
type seed struct {
	file, pub string
	kp        nkeys.KeyPair
}

func newSeed(t *testing.T, dir, name string, create func() (nkeys.KeyPair, error)) seed {
	t.Helper()
	path := filepath.Join(dir, name+".nk")
	kp, pub := natsembed.WriteSeed(t, path, create)
	return seed{file: path, pub: pub, kp: kp}
}

// generation is the callout's keys of one server configuration: the xkey,
// the issuer (server-config: the auth_callout issuer; operator: the callout
// account's signing key) and, in operator mode, the Runners' account's
// signing key.
type generation struct {
	xkey, issuer, user seed
}

// keyring is everything both generations share, and the two generations.
type keyring struct {
	mode     callout.Mode
	old, new generation

	// Operator mode: the operator, the accounts' own keys, and the users that
	// stay valid across the rotation (the callout's, the Server's, the kick
	// identity's and the sentinel), each signed by a signing key of its
	// account that the rotation keeps.
	operator                    nkeys.KeyPair
	sys, auth, runners          seed
	calloutCreds, serverCreds   string
	kickCreds, sentinel, opJWT  string
	sysJWT                      string
	authJWT, runnersJWT         map[*generation]string
	calloutAccount, userAccount string
}

// rotated says which keys change between the generations.
type rotated struct{ xkey, issuer bool }

func newKeyring(t *testing.T, dir string, mode callout.Mode, rot rotated) *keyring {
	t.Helper()
	k := &keyring{mode: mode}
	curve := func() (nkeys.KeyPair, error) { return nkeys.CreateCurveKeys() }
	k.old = generation{xkey: newSeed(t, dir, "xkey-old", curve), issuer: newSeed(t, dir, "issuer-old", nkeys.CreateAccount)}
	k.new = k.old
	if rot.xkey {
		k.new.xkey = newSeed(t, dir, "xkey-new", curve)
	}
	if rot.issuer {
		k.new.issuer = newSeed(t, dir, "issuer-new", nkeys.CreateAccount)
	}
	if mode == callout.ModeServerConfig {
		return k
	}
	k.old.user = newSeed(t, dir, "user-signer-old", nkeys.CreateAccount)
	k.new.user = k.old.user
	if rot.issuer {
		k.new.user = newSeed(t, dir, "user-signer-new", nkeys.CreateAccount)
	}
	k.operatorMode(t, dir)
	return k
}

// operatorMode makes the operator, SYS, AUTH and RUNNERS, and each
// generation's AUTH and RUNNERS account JWTs, in the layout
// deploy/nats/README.md's recipe makes: the operator requires signing keys
// (nsc edit operator --require-signing-keys), so the accounts are signed by
// the operator's signing key and every user by a signing key of its
// account, never by the account's own key. Each account that the callout
// signs for has two kinds of signing key: one for the users an operator
// makes (the callout's own user and the sentinel in AUTH, compass-server in
// RUNNERS), which stays, and the callout's, which the rotation replaces
// (each generation's JWT lists the kept key and its own callout key). The
// rotation therefore never removes a key a live identity depends on.
func (k *keyring) operatorMode(t *testing.T, dir string) {
	t.Helper()
	var err error
	k.operator, err = nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	opSigner := newSeed(t, dir, "operator-signing", nkeys.CreateOperator)
	opub, _ := k.operator.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "compass"
	oc.StrictSigningKeyUsage = true
	oc.SigningKeys.Add(opSigner.pub)
	k.opJWT = encode(t, oc, k.operator)
	k.sys = newSeed(t, dir, "sys", nkeys.CreateAccount)
	k.auth = newSeed(t, dir, "auth", nkeys.CreateAccount)
	k.runners = newSeed(t, dir, "runners", nkeys.CreateAccount)
	k.calloutAccount, k.userAccount = k.auth.pub, k.runners.pub
	// The signing keys of the users an operator makes: never rotated with
	// the callout's keys.
	sysUsers := newSeed(t, dir, "sys-users-signing", nkeys.CreateAccount)
	authUsers := newSeed(t, dir, "auth-users-signing", nkeys.CreateAccount)
	runnersUsers := newSeed(t, dir, "runners-users-signing", nkeys.CreateAccount)
	sc := jwt.NewAccountClaims(k.sys.pub)
	sc.Name = "SYS"
	sc.SigningKeys.Add(sysUsers.pub)
	k.sysJWT = encode(t, sc, opSigner.kp)

	calloutUser := newSeed(t, dir, "callout-user", nkeys.CreateUser)
	k.authJWT, k.runnersJWT = map[*generation]string{}, map[*generation]string{}
	for _, g := range []*generation{&k.old, &k.new} {
		ac := jwt.NewAccountClaims(k.auth.pub)
		ac.Name = "AUTH"
		ac.SigningKeys.Add(authUsers.pub, g.issuer.pub)
		ac.EnableExternalAuthorization(calloutUser.pub)
		ac.Authorization.AllowedAccounts.Add(k.runners.pub)
		ac.Authorization.XKey = g.xkey.pub
		k.authJWT[g] = encode(t, ac, opSigner.kp)
		rc := jwt.NewAccountClaims(k.runners.pub)
		rc.Name = "RUNNERS"
		rc.SigningKeys.Add(runnersUsers.pub, g.user.pub)
		k.runnersJWT[g] = encode(t, rc, opSigner.kp)
	}
	k.calloutCreds = creds(t, dir, "callout", calloutUser, authUsers.kp, k.auth.pub, nil)
	k.serverCreds = creds(t, dir, "compass-server", newSeed(t, dir, "server-user", nkeys.CreateUser), runnersUsers.kp, k.runners.pub, nil)
	k.kickCreds = creds(t, dir, "compass-kick", newSeed(t, dir, "kick-user", nkeys.CreateUser), sysUsers.kp, k.sys.pub, func(uc *jwt.UserClaims) {
		uc.Pub.Allow.Add(kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick)
		uc.Sub.Allow.Add("_INBOX.>")
	})
	// Every client without a JWT of its own (every Runner) becomes this
	// deny-all bearer user of AUTH, which sends its CONNECT to the callout.
	sentinel := newSeed(t, dir, "sentinel", nkeys.CreateUser)
	sen := jwt.NewUserClaims(sentinel.pub)
	sen.Name = "sentinel"
	sen.BearerToken = true
	sen.IssuerAccount = k.auth.pub
	sen.Permissions.Pub.Deny.Add(">")
	sen.Permissions.Sub.Deny.Add(">")
	k.sentinel = encode(t, sen, authUsers.kp)
}

func encode(t *testing.T, c interface {
	Encode(nkeys.KeyPair) (string, error)
}, kp nkeys.KeyPair) string {
	t.Helper()
	s, err := c.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// creds writes a .creds file for user, signed by signer, a signing key of
// account (its public key).
func creds(t *testing.T, dir, name string, user seed, signer nkeys.KeyPair, account string, mod func(*jwt.UserClaims)) string {
	t.Helper()
	uc := jwt.NewUserClaims(user.pub)
	uc.Name = name
	uc.IssuerAccount = account
	if mod != nil {
		mod(uc)
	}
	useed, _ := user.kp.Seed()
	b, err := jwt.FormatUserConfig(encode(t, uc, signer), useed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ports are one node's fixed ports, so that it restarts where its peers and
// clients expect it.
type ports struct{ client, cluster, monitor int }

// conf is node i's configuration in generation g; all holds every node's ports.
func (k *keyring) conf(g *generation, i int, all []ports) string {
	var routes []string
	for j, p := range all {
		if j != i {
			routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats://127.0.0.1:%d", p.cluster)))
		}
	}
	head := fmt.Sprintf(`
server_name: n%d
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
cluster { name: compass, listen: "127.0.0.1:%d", routes: [ %s ] }
`, i, all[i].client, all[i].monitor, all[i].cluster, strings.Join(routes, ", "))
	if k.mode == callout.ModeOperator {
		return head + natsembed.OperatorConfig(k.opJWT, k.sys.pub, k.sentinel,
			[2]string{k.sys.pub, k.sysJWT}, [2]string{k.runners.pub, k.runnersJWT[g]}, [2]string{k.auth.pub, k.authJWT[g]}) +
			"authorization { timeout: 5 }\n"
	}
	return head + fmt.Sprintf(`
accounts {
  CALLOUT { users: [ { user: %q, password: %q } ] }
  %s { users: [ { user: %q, password: %q } ] }
  SYS { users: [ %s ] }
}
system_account: SYS
authorization {
  timeout: 5
  auth_callout {
    issuer: %s
    account: CALLOUT
    auth_users: [ %q, %q, %q ]
    xkey: %s
  }
}
`, natsembed.CalloutUser, natsembed.CalloutPassword, natsembed.Account, natsembed.ServerUser, natsembed.ServerPassword,
		natsembed.KickUserConfig, g.issuer.pub, natsembed.CalloutUser, natsembed.ServerUser, natsembed.KickUser, g.xkey.pub)
}

// serveConfig is the callout's configuration holding gens (the current
// first, then the next), as the documented procedure sets its flags.
func (k *keyring) serveConfig(urls string, gens ...*generation) callout.ServeConfig {
	cur := gens[0]
	c := callout.ServeConfig{
		NATSURLs: urls, Mode: k.mode, IssuerSeedFile: cur.issuer.file, XKeySeedFile: cur.xkey.file,
		Connections: 3,
	}
	if k.mode == callout.ModeOperator {
		c.NATSCreds, c.KickCreds = k.calloutCreds, k.kickCreds
		c.CalloutAccount, c.UserSeedFile, c.Account = k.calloutAccount, cur.user.file, k.userAccount
	} else {
		c.NATSUser, c.NATSPassword = natsembed.CalloutUser, natsembed.CalloutPassword
		c.KickUser, c.KickPassword = natsembed.KickUser, natsembed.KickPassword
		c.Account = natsembed.Account
	}
	if len(gens) > 1 {
		next := gens[1]
		if next.xkey.pub != cur.xkey.pub {
			c.NextXKeySeedFile = next.xkey.file
		}
		if next.issuer.pub != cur.issuer.pub {
			c.NextIssuerSeedFile = next.issuer.file
		}
		if next.user.pub != cur.user.pub {
			c.NextUserSeedFile = next.user.file
		}
	}
	return c
}
