package callout

// Key rotation without a refusal window (docs/designs/DECISIONS.md, DL-316.4).
//
// nats-server cannot reload an auth_callout block (a SIGHUP logs "config
// reload not supported for AuthCallout"), so a new issuer or xkey reaches a
// NATS cluster only as its nodes restart, one at a time, and for the length
// of that roll some servers run the old configuration and some the new. The
// callout therefore holds the keys of both and answers each request with the
// keys its server expects, read from the request itself:
//
//   - the xkey: a server seals its request to the xkey it was configured
//     with and opens the answer with that same key (server/auth_callout.go:
//     xkp.Open(msg, pubAccXKey)). The request does not name it (its
//     Nats-Server-Xkey header is the server's own curve key), so the callout
//     tries each xkey it holds: NaCl's box is authenticated, so a wrong key
//     fails its Poly1305 check and never yields a plaintext, and the key
//     that opens the request is the key that seals the answer.
//   - the issuer, in server-config mode: the request's subject is the
//     auth_callout issuer the server was configured with, and the server
//     accepts a user JWT signed by that key alone (and, for a plain answer,
//     a response signed by it alone). The subject picks the signer.
//   - the signing keys, in operator mode: the request's subject is the
//     callout account, the same in both configurations, so nothing in it
//     tells which signing keys the server's account JWTs list. The xkey does:
//     each generation of operator-mode keys comes with its own xkey, and the
//     xkey that opens a request picks that generation's signers. (Without a
//     new xkey, the account JWT itself carries the overlap: list the new
//     signing key beside the old one until every server has it.)
//
// Attacker model: nothing about the choice is taken on trust. A request
// sealed to neither xkey is dropped (undecryptable), one whose subject names
// no issuer the callout holds is dropped (wrong_callout), and every other
// check of request.go applies to whichever keys answer. Holding a second key
// widens nothing a forger can reach: it is a key the operator's own servers
// are being given, and it is gone again after the roll.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nkeys"
)

// MaxKeyGenerations bounds the key generations a callout holds: the current
// one and the one a rotation moves to. A roll needs no more (every server
// runs one of two configurations), a third would be a rotation begun before
// the last one ended, and each xkey held is one more trial opening of a
// request sealed to none of them.
const MaxKeyGenerations = 2

// NextKeys are the keys of the configuration a rotation moves the servers to,
// held beside Config's current keys while servers of both configurations run.
// A nil field is the current key, unchanged by this rotation.
type NextKeys struct {
	// XKey is the next auth_callout xkey (operator mode: the callout
	// account's authorization xkey). It needs a current Config.XKey: a
	// rotation does not turn sealing on or off.
	XKey *XKey
	// ResponseSigner is the next auth_callout issuer (server-config mode) or
	// the callout account's next signing key (operator mode).
	ResponseSigner *Signer
	// UserSigner is the Runners' account's next signing key (operator mode).
	UserSigner *Signer
}

// keyGen is the keys one answer is made with.
type keyGen struct {
	xkey        *XKey // nil: the request was plain
	resp        *Signer
	respIssAcct string
	user        *Signer
	userIssAcct string
}

// holdNext checks cfg.Next against the current keys already set on r and
// adds the next generation: a second xkey to try and, in server-config mode,
// a second issuer to answer as; in operator mode, the second xkey's signers.
func (r *Responder) holdNext(cfg Config) error {
	n := cfg.Next
	if n == nil {
		return nil
	}
	switch {
	case n.XKey == nil && n.ResponseSigner == nil && n.UserSigner == nil:
		return errors.New("callout: config: Next holds no key")
	case n.XKey != nil && cfg.XKey == nil:
		return errors.New("callout: config: a next xkey needs a current one: a rotation does not turn sealing on or off")
	case n.XKey != nil && n.XKey.Public() == cfg.XKey.Public():
		return errors.New("callout: config: the next xkey is the current one")
	case n.ResponseSigner != nil && n.ResponseSigner.Prefix() != nkeys.PrefixByteAccount:
		return fmt.Errorf("callout: config: the next response signer must be an account key, not %s", n.ResponseSigner.Prefix())
	case n.ResponseSigner != nil && n.ResponseSigner.Public() == cfg.ResponseSigner.Public():
		return errors.New("callout: config: the next response signer is the current one")
	case n.UserSigner != nil && cfg.Mode != ModeOperator:
		return errors.New("callout: config: server-config mode signs everything with the issuer; a next UserSigner is an operator-mode setting")
	case n.UserSigner != nil && n.UserSigner.Prefix() != nkeys.PrefixByteAccount:
		return fmt.Errorf("callout: config: the next user signer must be an account key, not %s", n.UserSigner.Prefix())
	case n.UserSigner != nil && n.UserSigner.Public() == cfg.UserSigner.Public():
		return errors.New("callout: config: the next user signer is the current one")
	case cfg.Mode == ModeOperator && n.XKey == nil:
		return errors.New("callout: config: in operator mode a request tells its server's keys only by the xkey it is sealed to: rotate the signing keys with a next xkey, or list the new signing key beside the old one in the account JWT")
	}
	if n.XKey != nil {
		r.xkeys = append(r.xkeys, n.XKey)
	}
	if cfg.Mode == ModeServerConfig {
		if n.ResponseSigner != nil {
			r.gens = append(r.gens, keyGen{resp: n.ResponseSigner, user: n.ResponseSigner})
		}
		return nil
	}
	next := r.gens[0]
	if n.ResponseSigner != nil {
		next.resp, next.respIssAcct = n.ResponseSigner, issuerAccount(n.ResponseSigner, r.reqSubject)
	}
	if n.UserSigner != nil {
		next.user, next.userIssAcct = n.UserSigner, issuerAccount(n.UserSigner, r.audience)
	}
	r.gens = append(r.gens, next)
	return nil
}

// issuerAccount is the issuer_account a JWT signed by s for account carries:
// none when s is the account's own key.
func issuerAccount(s *Signer, account string) string {
	if s.Public() == account {
		return ""
	}
	return account
}

// open opens a sealed request with whichever held xkey it was sealed to, and
// says which (an index into r.xkeys).
func (r *Responder) open(data []byte, sender string) ([]byte, int, bool) {
	for i, x := range r.xkeys {
		if opened, err := x.Open(data, sender); err == nil {
			return opened, i, true
		}
	}
	return nil, 0, false
}

// keysFor picks the keys that answer a request addressed to subject and
// opened with xkey xk (-1 when plain), or reports that the request is not
// addressed to this callout.
func (r *Responder) keysFor(subject string, xk int) (keyGen, bool) {
	var k keyGen
	found := false
	switch r.cfg.Mode {
	case ModeServerConfig:
		for _, g := range r.gens {
			if g.resp.Public() == subject {
				k, found = g, true
				break
			}
		}
	default:
		if subject == r.reqSubject {
			k, found = r.gens[max(xk, 0)], true
		}
	}
	if xk >= 0 {
		k.xkey = r.xkeys[xk]
	}
	return k, found
}

// HeldKeys are the public keys the responder answers with, current first,
// by role: "xkey", "issuer" (the answers' signers) and, in operator mode,
// "user_signer". None is secret.
func (r *Responder) HeldKeys() map[string][]string {
	m := map[string][]string{}
	for _, x := range r.xkeys {
		m[KeyRoleXKey] = append(m[KeyRoleXKey], x.Public())
	}
	for _, g := range r.gens {
		if p := g.resp.Public(); !slices.Contains(m[KeyRoleIssuer], p) {
			m[KeyRoleIssuer] = append(m[KeyRoleIssuer], p)
		}
		if p := g.user.Public(); r.cfg.Mode == ModeOperator && !slices.Contains(m[KeyRoleUserSigner], p) {
			m[KeyRoleUserSigner] = append(m[KeyRoleUserSigner], p)
		}
	}
	return m
}

// RunnerIssuers are the keys (or, in server-config mode, the account name) a
// NATS server reports as the issuer of the users this responder grants, in
// every generation it holds: what the kicker judges as its own.
func (r *Responder) RunnerIssuers() []string {
	var out []string
	for _, g := range r.gens {
		is := r.audience
		if g.userIssAcct != "" {
			is = g.user.Public()
		}
		if !slices.Contains(out, is) {
			out = append(out, is)
		}
	}
	return out
}

// The roles of HeldKeys and of compass_callout_key_answers_total.
const (
	KeyRoleXKey       = "xkey"
	KeyRoleIssuer     = "issuer"
	KeyRoleUserSigner = "user_signer"
)
