// Package testkeys hands tests signing keys without generating RSA keys.
//
// Generating an RSA 2048 key costs tens of milliseconds of CPU; the verifier,
// callout and door tests start dozens of issuers and rotate their keys, and
// key generation was most of their CPU time (and so of every mutant's run in
// mutation testing). Key hands out the RSA keys of an embedded pool, each at
// most once per process, so two issuers in one test never share a key unless
// the test says so. When the pool is used up it generates keys as
// kubeissuer.NewKey does. ES256 keys are cheap and always generated.
//
// The pool's private keys are public: they are for tests only, and nothing
// outside a test process may trust a key from here.
package testkeys

import (
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"fmt"
	"sync"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/kubeissuer"
)

//go:generate go run gen.go -n 192 -o testdata/rsa2048.pem

//go:embed testdata/rsa2048.pem
var poolPEM []byte

var (
	mu   sync.Mutex
	rest = poolPEM // PEM blocks not handed out yet
)

// Key returns a signing key for alg: for RS256 the next unused key of the
// pool, for ES256 a fresh one. It has the signature of kubeissuer.NewKey, for
// kubeissuer.Options.NewKey.
func Key(alg kubeissuer.Alg) (jose.JSONWebKey, error) {
	if alg != kubeissuer.RS256 {
		return kubeissuer.NewKey(alg)
	}
	mu.Lock()
	b, r := pem.Decode(rest)
	rest = r
	mu.Unlock()
	if b == nil {
		return kubeissuer.NewKey(alg)
	}
	priv, err := x509.ParsePKCS1PrivateKey(b.Bytes)
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("testkeys: pool key: %w", err)
	}
	return kubeissuer.KeyOf(priv, alg)
}

// Issuer starts an RS256 issuer signing with keys from the pool, and closes
// it when the test ends.
func Issuer(t testing.TB) *kubeissuer.Issuer {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: Key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	return is
}

// Token is is's projected token for a pod on node, with the default
// lifetime; the test fails if is cannot sign it.
func Token(t testing.TB, is *kubeissuer.Issuer, node string) string {
	t.Helper()
	tok, err := is.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
