package verifier

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// Each algorithm Kubernetes signs with verifies against a real TLS issuer
// serving discovery and JWKS, and yields the DL-440 subject.
func TestVerify_Algorithms(t *testing.T) {
	for _, alg := range []kubeissuer.Alg{kubeissuer.RS256, kubeissuer.ES256} {
		t.Run(string(alg), func(t *testing.T) {
			clk := newClock()
			is := newIssuer(t, alg, clk)
			v := newVerifier(t, clk, clusterFor(t, is, "prod-eks"))
			mustRefresh(t, v)
			claims := is.Claims(kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "n-uid", PodName: "compass-runner-x7k2p", PodUID: "p-uid"}, 0)
			tok := mustSign(t, is, claims)
			sub, err := verify(t, v, tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			want := Subject{
				Kind: SubjectRunner, ID: "prod-eks/ip-10-0-1-5_ec2_internal", Tenant: "tenant-1",
				Expiry: clk.Now().Add(600 * time.Second),
				Workload: &Workload{
					Cluster: "prod-eks", Namespace: "compass-runner", ServiceAccount: "compass-runner",
					NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "n-uid", PodName: "compass-runner-x7k2p", PodUID: "p-uid",
					JTI: claims["jti"].(string), IssuedAt: clk.Now(), KeyID: is.SigningKey().KeyID,
				},
			}
			if sub.Kind != want.Kind || sub.ID != want.ID || sub.Tenant != want.Tenant || !sub.Expiry.Equal(want.Expiry) {
				t.Fatalf("subject = %+v, want %+v", sub, want)
			}
			w := *sub.Workload
			w.IssuedAt = w.IssuedAt.UTC()
			ww := *want.Workload
			ww.IssuedAt = ww.IssuedAt.UTC()
			if w != ww {
				t.Fatalf("workload = %+v, want %+v", w, ww)
			}
			if sub.Method() != "projected" {
				t.Fatalf("Method() = %q", sub.Method())
			}
		})
	}
}

// Every rejection in DL-440's W1 list, and the header attacks, each with its
// exact cause. Every case builds its own token.
func TestVerify_Rejections(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	other := newIssuer(t, kubeissuer.RS256, clk) // an issuer nobody registered
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	mustRefresh(t, v)

	pod := kubeissuer.Pod{NodeName: "node-a"}
	edit := func(f func(c map[string]any)) string {
		c := is.Claims(pod, 0)
		f(c)
		return mustSign(t, is, c)
	}
	k8s := func(c map[string]any) map[string]any { return c["kubernetes.io"].(map[string]any) }
	signing := is.SigningKey()
	withHeaders := func(h map[jose.HeaderKey]any) string {
		tok, err := kubeissuer.SignWith(signing, is.Claims(pod, 0), h)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	b64 := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	attacker, err := testkeys.Key(kubeissuer.RS256)
	if err != nil {
		t.Fatal(err)
	}
	attacker.KeyID = signing.KeyID // claims the registered kid

	// HS256 signed with the issuer's RSA public key as the HMAC secret: the
	// classic algorithm-confusion forgery.
	pubDER, err := x509.MarshalPKIXPublicKey(signing.Key.(*rsa.PrivateKey).Public())
	if err != nil {
		t.Fatal(err)
	}
	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: pubDER},
		(&jose.SignerOptions{}).WithHeader("kid", signing.KeyID))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(is.Claims(pod, 0))
	hsJWS, err := hs.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	hsTok, _ := hsJWS.CompactSerialize()

	cases := []struct {
		name  string
		tok   string
		cause error
	}{
		{"wrong aud", edit(func(c map[string]any) { c["aud"] = []string{"https://kubernetes.default.svc"} }), errAudience},
		{"unknown iss", mustToken(t, other, "node-a"), errUnknownIssuer},
		{"iss with trailing slash", edit(func(c map[string]any) { c["iss"] = is.URL() + "/" }), errUnknownIssuer},
		{"empty kid", func() string {
			k := signing
			k.KeyID = ""
			tok, err := kubeissuer.SignWith(k, is.Claims(pod, 0), nil)
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}(), errNoKID},
		{"expired", edit(func(c map[string]any) {
			c["iat"] = clk.Now().Add(-20 * time.Minute).Unix()
			c["nbf"] = c["iat"]
			c["exp"] = clk.Now().Add(-10*time.Minute - Leeway).Unix()
		}), errExpired},
		{"future nbf", edit(func(c map[string]any) { c["nbf"] = clk.Now().Add(5 * time.Minute).Unix() }), errNotYetValid},
		{"future iat", edit(func(c map[string]any) {
			c["iat"] = clk.Now().Add(5 * time.Minute).Unix()
			c["exp"] = clk.Now().Add(10 * time.Minute).Unix()
		}), errIssuedInFuture},
		{"absent exp", edit(func(c map[string]any) { delete(c, "exp") }), errNoExp},
		{"absent iat", edit(func(c map[string]any) { delete(c, "iat") }), errNoIat},
		{"exp - iat > maxTokenLifetime", edit(func(c map[string]any) { c["exp"] = clk.Now().Add(601 * time.Second).Unix() }), errLifetime},
		{"wrong sub", edit(func(c map[string]any) { c["sub"] = "system:serviceaccount:compass-runner:default" }), errSubject},
		{"wrong namespace", edit(func(c map[string]any) { k8s(c)["namespace"] = "default" }), errNamespace},
		{"no kubernetes.io", edit(func(c map[string]any) { delete(c, "kubernetes.io") }), errNamespace},
		{"wrong serviceaccount", edit(func(c map[string]any) {
			k8s(c)["serviceaccount"] = map[string]any{"name": "default", "uid": "x"}
		}), errServiceAccount},
		{"missing pod", edit(func(c map[string]any) { delete(k8s(c), "pod") }), errNoPod},
		{"empty pod name", edit(func(c map[string]any) { k8s(c)["pod"] = map[string]any{"name": "", "uid": "x"} }), errNoPod},
		{"missing node", edit(func(c map[string]any) { delete(k8s(c), "node") }), errNoNode},
		{"node name not RFC 1123", edit(func(c map[string]any) { k8s(c)["node"] = map[string]any{"name": "a_b", "uid": "x"} }), errNodeName},
		{"node name with slash", edit(func(c map[string]any) { k8s(c)["node"] = map[string]any{"name": "a/b", "uid": "x"} }), errNodeName},
		{"node name with wildcard", edit(func(c map[string]any) { k8s(c)["node"] = map[string]any{"name": "*", "uid": "x"} }), errNodeName},
		{"alg none", b64(map[string]string{"alg": "none", "kid": signing.KeyID}) + "." + b64(is.Claims(pod, 0)) + ".", errAlgorithm},
		{"HS256 with the RSA public key as secret", hsTok, errAlgorithm},
		{"RS512", func() string {
			s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS512, Key: signing.Key}, (&jose.SignerOptions{}).WithHeader("kid", signing.KeyID))
			if err != nil {
				t.Fatal(err)
			}
			j, _ := s.Sign(payload)
			tok, _ := j.CompactSerialize()
			return tok
		}(), errAlgorithm},
		{"jwk header injection", func() string {
			tok, err := kubeissuer.SignWith(attacker, is.Claims(pod, 0), map[jose.HeaderKey]any{"jwk": attacker.Public()})
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}(), errHeader},
		{"jku header", withHeaders(map[jose.HeaderKey]any{"jku": "https://attacker.example/jwks"}), errHeader},
		{"x5u header", withHeaders(map[jose.HeaderKey]any{"x5u": "https://attacker.example/cert"}), errHeader},
		{"x5c header", withHeaders(map[jose.HeaderKey]any{"x5c": []string{"MIIB"}}), errHeader},
		{"crit header", withHeaders(map[jose.HeaderKey]any{"crit": []string{"exp"}, "exp": 1}), errHeader},
		{"attacker key under the registered kid", func() string {
			tok, err := kubeissuer.SignWith(attacker, is.Claims(pod, 0), nil)
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}(), errSignature},
		{"tampered payload", func() string {
			tok := mustToken(t, is, "node-a")
			parts := strings.Split(tok, ".")
			c := is.Claims(kubeissuer.Pod{NodeName: "node-b"}, 0)
			return parts[0] + "." + b64(c) + "." + parts[2]
		}(), errSignature},
		{"too long", strings.Repeat("a", MaxTokenBytes/2) + "." + strings.Repeat("b", MaxTokenBytes/2) + ".c", errTooLong},
		{"one dot", "abc.def", errMalformed},
		{"three dots", "a.b.c.d", errMalformed},
		{"empty", "", errMalformed},
		{"header not base64", "!!!.e30.sig", errMalformed},
		{"header not JSON", base64.RawURLEncoding.EncodeToString([]byte("nope")) + ".e30.c2ln", errMalformed},
		{"payload not JSON", b64(map[string]string{"alg": "RS256", "kid": signing.KeyID}) + "." + base64.RawURLEncoding.EncodeToString([]byte("{")) + ".c2ln", errClaims},
	}
	fetches := is.JWKSFetches()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := verify(t, v, tc.tok)
			if err == nil {
				t.Fatalf("Verify accepted the token: %+v", sub)
			}
			if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrKeysUnavailable) {
				t.Fatalf("error %v is not only ErrUnauthenticated", err)
			}
			if !errors.Is(err, tc.cause) {
				t.Fatalf("error = %v, want cause %v", err, tc.cause)
			}
			if sub != (Subject{}) {
				t.Fatalf("a failure returned a subject: %+v", sub)
			}
		})
	}
	// None of these has an unknown kid on a known issuer, so none may fetch.
	if got := is.JWKSFetches() - fetches; got != 0 {
		t.Fatalf("rejections caused %d JWKS fetches, want 0", got)
	}
}

// The leeway is one minute past exp: the token is honoured until exp +
// Leeway, and refused from that instant on (Subject.NotAfter).
func TestVerify_Leeway(t *testing.T) {
	clk, is, v := loadedProd(t, kubeissuer.RS256)
	tok := mustToken(t, is, "node-a")
	clk.Advance(600*time.Second + Leeway - time.Second)
	sub, err := verify(t, v, tok)
	if err != nil {
		t.Fatalf("inside leeway: %v", err)
	}
	if want := sub.Expiry.Add(Leeway); !sub.NotAfter.Equal(want) {
		t.Fatalf("NotAfter = %v, want exp + Leeway = %v", sub.NotAfter, want)
	}
	clk.Advance(time.Second)
	if _, err := verify(t, v, tok); !errors.Is(err, errExpired) {
		t.Fatalf("at exp + Leeway: err = %v, want expired", err)
	}
}

// maxTokenLifetime raised in the cluster file admits longer tokens, and a
// token at exactly the bound verifies.
func TestVerify_MaxTokenLifetimeBound(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.ES256, clk)
	rc := clusterFor(t, is, "prod")
	rc.MaxTokenLifetime = time.Hour
	v := newVerifier(t, clk, rc)
	mustRefresh(t, v)
	tok, err := is.Token(kubeissuer.Pod{NodeName: "n"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, v, tok); err != nil {
		t.Fatalf("token at the bound: %v", err)
	}
	tok, _ = is.Token(kubeissuer.Pod{NodeName: "n"}, time.Hour+time.Second)
	if _, err := verify(t, v, tok); !errors.Is(err, errLifetime) {
		t.Fatalf("token past the bound: %v", err)
	}
}

// A cluster's namespace, ServiceAccount and audience come from the file.
func TestVerify_ClusterOverrides(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	rc := clusterFor(t, is, "prod")
	rc.Namespace, rc.ServiceAccount, rc.Audience = "ops", "runner", "compass-prod"
	v := newVerifier(t, clk, rc)
	mustRefresh(t, v)
	c := is.Claims(kubeissuer.Pod{Namespace: "ops", ServiceAccount: "runner", NodeName: "n"}, 0)
	c["aud"] = []string{"other", "compass-prod"}
	if _, err := verify(t, v, mustSign(t, is, c)); err != nil {
		t.Fatalf("overridden cluster: %v", err)
	}
	if _, err := verify(t, v, mustToken(t, is, "n")); !errors.Is(err, errAudience) {
		t.Fatalf("default-format token: %v, want audience mismatch", err)
	}
}

// Verify honours a cancelled context while waiting for a key fetch, and
// answers keys-unavailable rather than hanging.
func TestVerify_ContextCancelledDuringFetch(t *testing.T) {
	clk := newClock()
	release := make(chan struct{})
	is := newIssuerWrapped(t, clk, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
	})
	defer close(release)
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := v.Verify(ctx, mustToken(t, is, "n"))
	wantErr(t, err, "verifier: runner cluster keys unavailable: cluster prod: waiting for a key fetch: context canceled",
		ErrKeysUnavailable, context.Canceled)
}

// The size limits of a token, its header and its node name, at the limit and
// one past it: what is at the limit gets past that check (and fails, if at
// all, for another reason).
func TestVerify_SizeLimits(t *testing.T) {
	_, is, v := loadedProd(t, kubeissuer.ES256)

	pad := func(n int) string { // a JWS-shaped token of n bytes with a small header
		const head = "eyJhbGciOiJFUzI1NiJ9."
		return head + strings.Repeat("a", n-len(head)-4) + ".sig"
	}
	if _, err := verify(t, v, pad(16384)); errors.Is(err, errTooLong) || !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a token of 16384 bytes: %v, want refused but not as too long", err)
	}
	if _, err := verify(t, v, pad(16385)); !errors.Is(err, errTooLong) {
		t.Fatalf("a token of 16385 bytes: %v, want too long", err)
	}

	// A header segment decoding to exactly 1 KiB is read; one more is not.
	hdr := func(n int) string {
		return base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"ES256","kid":"` + strings.Repeat("a", n-24) + `"}`))
	}
	if got := base64.RawURLEncoding.DecodedLen(len(hdr(1024))); got != 1024 {
		t.Fatalf("header built to %d bytes", got)
	}
	if _, err := verify(t, v, hdr(1024)+".e30.c2ln"); errors.Is(err, errHeader) || !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a 1024-byte header: %v, want refused but not for its size", err)
	}
	if _, err := verify(t, v, hdr(1025)+".e30.c2ln"); !errors.Is(err, errHeader) {
		t.Fatalf("a 1025-byte header: %v, want the header refused", err)
	}

	// Node names: 253 bytes, as Kubernetes allows, verify; 254 do not.
	long := strings.Repeat(strings.Repeat("a", 62)+".", 4)[:252] + "b"
	sub, err := verify(t, v, mustToken(t, is, long))
	if err != nil || sub.ID != "prod/"+strings.ReplaceAll(long, ".", "_") {
		t.Fatalf("a node name of 253 bytes: %+v, %v", sub, err)
	}
	if _, err := verify(t, v, mustToken(t, is, "c"+long)); !errors.Is(err, errNodeName) {
		t.Fatalf("a node name of 254 bytes: %v, want refused", err)
	}
}

// A token whose payload is no base64 gets past the shape and header checks
// and is refused as malformed by the JWS parser.
func TestVerify_UnparsablePayload(t *testing.T) {
	_, _, v := loadedProd(t, kubeissuer.ES256)
	if _, err := verify(t, v, "eyJhbGciOiJFUzI1NiJ9.!!!.c2ln"); !errors.Is(err, errMalformed) {
		t.Fatalf("err = %v, want malformed", err)
	}
}

// Two keys under one kid: the one of the token's algorithm verifies it,
// whichever comes first in the set.
func TestVerify_KIDSharedByTwoKeyTypes(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	signing := is.SigningKey()
	ec, _ := testkeys.Key(kubeissuer.ES256)
	ec.KeyID = signing.KeyID
	is.Unpublish(signing.KeyID)
	is.PublishKey(ec, false)
	is.PublishKey(signing, true)
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	mustRefresh(t, v)
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("RS256 token, its kid shared with an EC key listed first: %v", err)
	}
}
