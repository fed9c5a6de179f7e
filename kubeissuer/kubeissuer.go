// Package kubeissuer is a local HTTPS OIDC issuer that signs tokens in the
// Kubernetes projected ServiceAccount token format. It stands in for a
// cluster's API server in tests and in `compass-server dev`: it serves
// /.well-known/openid-configuration and the JWKS over TLS with its own CA,
// signs RS256 or ES256 with a kid, rotates keys, and can keep a token file
// fresh the way a kubelet does.
//
// It is a development tool: its keys live in memory and it trusts its caller.
package kubeissuer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Alg is a signing algorithm the issuer can use.
type Alg = jose.SignatureAlgorithm

const (
	RS256 = jose.RS256
	ES256 = jose.ES256
)

// Options configure an Issuer. The zero value is an RS256 issuer on a random
// loopback port using the real clock.
type Options struct {
	Alg  Alg                             // RS256 (default) or ES256
	Addr string                          // listen address; default 127.0.0.1:0
	Now  func() time.Time                // clock for iat/exp; default time.Now
	Path string                          // issuer path suffix, e.g. "/id/EXAMPLE"; default ""
	Wrap func(http.Handler) http.Handler // optional middleware (fault injection in tests)

	// NewKey makes the issuer's signing keys (in New and Rotate); default
	// NewKey, a fresh random key each time. Tests pass testkeys.Key, which
	// hands out pre-generated RSA keys: generating RSA 2048 keys was four
	// fifths of the verifier tests' CPU time.
	NewKey func(Alg) (jose.JSONWebKey, error)
}

// Issuer is a running HTTPS OIDC issuer.
type Issuer struct {
	opts   Options
	srv    *http.Server
	ln     net.Listener
	url    string
	caPEM  []byte
	caPool *x509.CertPool

	mu       sync.Mutex
	signing  *jose.JSONWebKey  // private key tokens are signed with
	keys     []jose.JSONWebKey // private keys whose public halves are published
	jwksHits atomic.Int64
	discHits atomic.Int64
}

// New starts an issuer. Close it when done.
func New(opts Options) (*Issuer, error) {
	if opts.Alg == "" {
		opts.Alg = RS256
	}
	if opts.Alg != RS256 && opts.Alg != ES256 {
		return nil, fmt.Errorf("kubeissuer: unsupported alg %q", opts.Alg)
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NewKey == nil {
		opts.NewKey = NewKey
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("kubeissuer: listen: %w", err)
	}
	cert, caPEM, err := selfSigned(ln.Addr().(*net.TCPAddr).IP)
	if err != nil {
		ln.Close()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	is := &Issuer{opts: opts, ln: ln, caPEM: caPEM, caPool: pool}
	is.url = "https://" + ln.Addr().String() + opts.Path
	k, err := opts.NewKey(opts.Alg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	is.signing = &k
	is.keys = []jose.JSONWebKey{k}

	mux := http.NewServeMux()
	mux.HandleFunc("GET "+opts.Path+"/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		is.discHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                is.url,
			"jwks_uri":                              is.JWKSURL(),
			"response_types_supported":              []string{"id_token"},
			"subject_types_supported":               []string{"public"},
			"id_token_signing_alg_values_supported": []string{string(opts.Alg)},
		})
	})
	mux.HandleFunc("GET "+opts.Path+"/openid/v1/jwks", func(w http.ResponseWriter, r *http.Request) {
		is.jwksHits.Add(1)
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(is.JWKS())
	})
	var h http.Handler = mux
	if opts.Wrap != nil {
		h = opts.Wrap(mux)
	}
	is.srv = &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // TLS handshake noise from clients that do not trust the dev CA
	}
	go func() { _ = is.srv.ServeTLS(ln, "", "") }()
	return is, nil
}

// Close stops the server.
func (is *Issuer) Close() error { return is.srv.Close() }

// URL is the issuer URL (the iss of every token).
func (is *Issuer) URL() string { return is.url }

// JWKSURL is where the key set is served.
func (is *Issuer) JWKSURL() string { return is.url + "/openid/v1/jwks" }

// CAPEM is the PEM of the CA that signed the issuer's TLS certificate.
func (is *Issuer) CAPEM() []byte { return is.caPEM }

// WriteCAFile writes the CA PEM to path (for a cluster's caFile).
func (is *Issuer) WriteCAFile(path string) error {
	return os.WriteFile(path, is.caPEM, 0o644)
}

// Client returns an HTTP client that trusts the issuer's CA.
func (is *Issuer) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: is.caPool, MinVersion: tls.VersionTLS12}}}
}

// JWKSFetches and DiscoveryFetches count requests served.
func (is *Issuer) JWKSFetches() int64      { return is.jwksHits.Load() }
func (is *Issuer) DiscoveryFetches() int64 { return is.discHits.Load() }

// JWKS is the public key set as served.
func (is *Issuer) JWKS() []byte {
	is.mu.Lock()
	defer is.mu.Unlock()
	set := jose.JSONWebKeySet{}
	for _, k := range is.keys {
		set.Keys = append(set.Keys, k.Public())
	}
	b, _ := json.Marshal(set)
	return b
}

// SigningKey returns the current signing key (private) and its kid.
func (is *Issuer) SigningKey() jose.JSONWebKey {
	is.mu.Lock()
	defer is.mu.Unlock()
	return *is.signing
}

// Rotate adds a new key of the issuer's algorithm, publishes it beside the
// old ones and signs with it from now on. It returns the new kid.
func (is *Issuer) Rotate() (string, error) {
	k, err := is.opts.NewKey(is.opts.Alg)
	if err != nil {
		return "", err
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys = append(is.keys, k)
	is.signing = &is.keys[len(is.keys)-1]
	return k.KeyID, nil
}

// PublishKey adds a key to the served set (it may be another issuer's key:
// that is how tests share a key between clusters). sign makes it the signing key.
func (is *Issuer) PublishKey(k jose.JSONWebKey, sign bool) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys = append(is.keys, k)
	if sign {
		is.signing = &is.keys[len(is.keys)-1]
	}
}

// Unpublish removes every key with the given kid from the served set. The
// signing key is left as is.
func (is *Issuer) Unpublish(kid string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	out := is.keys[:0:0]
	for _, k := range is.keys {
		if k.KeyID != kid {
			out = append(out, k)
		}
	}
	is.keys = out
}

// NewKey generates a signing key: RSA 2048 for RS256, P-256 for ES256, with its
// RFC 7638 thumbprint as kid.
func NewKey(alg Alg) (jose.JSONWebKey, error) {
	var priv crypto.Signer
	var err error
	switch alg {
	case RS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return jose.JSONWebKey{}, fmt.Errorf("kubeissuer: unsupported alg %q", alg)
	}
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("kubeissuer: generate key: %w", err)
	}
	return KeyOf(priv, alg)
}

// KeyOf makes priv a signing key for alg, with its RFC 7638 thumbprint as kid.
func KeyOf(priv crypto.Signer, alg Alg) (jose.JSONWebKey, error) {
	k := jose.JSONWebKey{Key: priv, Algorithm: string(alg), Use: "sig"}
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("kubeissuer: thumbprint: %w", err)
	}
	k.KeyID = base64.RawURLEncoding.EncodeToString(tp)
	return k, nil
}

// selfSigned makes a CA and a serving certificate for ip and localhost.
func selfSigned(ip net.IP) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubeissuer dev CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kubeissuer"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{ip, net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, caPEM, nil
}

// WriteCAFileIn writes the issuer's CA to dir/<name>-ca.pem and returns the
// path, for a cluster registration's caFile:
//
//	verifier.RunnerCluster{Name: name, Issuer: is.URL(), CAFile: path}
func (is *Issuer) WriteCAFileIn(dir, name string) (string, error) {
	caFile := filepath.Join(dir, name+"-ca.pem")
	if err := is.WriteCAFile(caFile); err != nil {
		return "", fmt.Errorf("kubeissuer: %w", err)
	}
	return caFile, nil
}
