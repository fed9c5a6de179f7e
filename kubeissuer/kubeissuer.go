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
	"context"
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

	"github.com/compass-runner/identity/internal/atomicfile"
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

// Pod names the workload a projected token is for.
type Pod struct {
	Namespace      string // default compass-runner
	ServiceAccount string // default compass-runner
	PodName        string // default compass-runner-<node>
	PodUID         string
	NodeName       string // required
	NodeUID        string
}

// Claims returns the claims the Kubernetes API server puts in a projected
// token for pod, with audience compass-runner, issued now and valid for
// lifetime (600 s when zero). Tests edit the map to make bad tokens.
func (is *Issuer) Claims(p Pod, lifetime time.Duration) map[string]any {
	if p.Namespace == "" {
		p.Namespace = "compass-runner"
	}
	if p.ServiceAccount == "" {
		p.ServiceAccount = "compass-runner"
	}
	if p.PodName == "" {
		p.PodName = "compass-runner-" + p.NodeName
	}
	if p.PodUID == "" {
		p.PodUID = uid()
	}
	if p.NodeUID == "" {
		p.NodeUID = uid()
	}
	if lifetime == 0 {
		lifetime = 600 * time.Second
	}
	now := is.opts.Now()
	return map[string]any{
		"aud": []string{"compass-runner"},
		"exp": now.Add(lifetime).Unix(),
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"iss": is.url,
		"jti": uid(),
		"sub": "system:serviceaccount:" + p.Namespace + ":" + p.ServiceAccount,
		"kubernetes.io": map[string]any{
			"namespace":      p.Namespace,
			"node":           map[string]any{"name": p.NodeName, "uid": p.NodeUID},
			"pod":            map[string]any{"name": p.PodName, "uid": p.PodUID},
			"serviceaccount": map[string]any{"name": p.ServiceAccount, "uid": uid()},
		},
	}
}

// Token signs a projected token for p (see Claims).
func (is *Issuer) Token(p Pod, lifetime time.Duration) (string, error) {
	return is.Sign(is.Claims(p, lifetime))
}

// Sign signs arbitrary claims with the current signing key, with the kid header set.
func (is *Issuer) Sign(claims map[string]any) (string, error) {
	return SignWith(is.SigningKey(), claims, nil)
}

// SignWith signs claims with key k. extraHeaders are added to the protected
// header (tests use it to inject jwk, jku, crit...). The kid is k.KeyID.
func SignWith(k jose.JSONWebKey, claims map[string]any, extraHeaders map[jose.HeaderKey]any) (string, error) {
	opts := (&jose.SignerOptions{}).WithType("JWT")
	opts.ExtraHeaders[jose.HeaderKey("kid")] = k.KeyID
	for h, v := range extraHeaders {
		opts.ExtraHeaders[h] = v
	}
	if k.KeyID == "" {
		delete(opts.ExtraHeaders, "kid")
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.SignatureAlgorithm(k.Algorithm), Key: k.Key}, opts)
	if err != nil {
		return "", fmt.Errorf("kubeissuer: signer: %w", err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("kubeissuer: claims: %w", err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("kubeissuer: sign: %w", err)
	}
	return jws.CompactSerialize()
}

// WriteTokenFile writes a fresh token for p to path atomically (write to a
// temporary file in the same directory, then rename), as a kubelet does.
func (is *Issuer) WriteTokenFile(path string, p Pod, lifetime time.Duration) (time.Time, error) {
	claims := is.Claims(p, lifetime)
	tok, err := is.Sign(claims)
	if err != nil {
		return time.Time{}, err
	}
	if err := atomicfile.Write(path, []byte(tok)); err != nil {
		return time.Time{}, fmt.Errorf("kubeissuer: token file: %w", err)
	}
	return time.Unix(claims["exp"].(int64), 0), nil
}

// RotateTokenFile keeps a token for p in path until ctx ends: it writes one now
// and rewrites it when 80 % of its lifetime has passed, as a kubelet does.
// after is the timer (time.After in production; tests pass a channel they
// control). onWrite, if set, is called after each write.
func (is *Issuer) RotateTokenFile(ctx context.Context, path string, p Pod, lifetime time.Duration,
	after func(time.Duration) <-chan time.Time, onWrite func(exp time.Time, err error)) error {
	if lifetime == 0 {
		lifetime = 600 * time.Second
	}
	if after == nil {
		after = time.After
	}
	for {
		exp, err := is.WriteTokenFile(path, p, lifetime)
		if onWrite != nil {
			onWrite(exp, err)
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-after(lifetime * 8 / 10):
		}
	}
}

func uid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
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
