package verifier

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Verification limits, each with its reason.
const (
	// MaxTokenBytes caps a presented token before any parsing. Projected
	// ServiceAccount tokens are 1-2 KiB; anything much larger is an attempt to
	// make an unauthenticated caller's request expensive.
	MaxTokenBytes = 16 << 10
	// maxHeaderBytes caps the decoded JOSE header (Kubernetes writes alg and kid).
	maxHeaderBytes = 1 << 10
	// Leeway is the clock skew allowed on exp, nbf and iat.
	Leeway = jwt.DefaultLeeway
)

// allowedAlgs are the only signature algorithms: those Kubernetes signs with.
// Listing them in ParseSigned rejects "none" and every HMAC algorithm, so a
// public key can never be used as an HMAC secret.
var allowedAlgs = []jose.SignatureAlgorithm{jose.RS256, jose.ES256}

// allowedHeaders are the only JOSE header parameters accepted. A token that
// tries to bring its own key (jwk, jku, x5u, x5c, x5t) or marks anything
// critical (crit) is refused before any key lookup.
var allowedHeaders = map[string]bool{"alg": true, "kid": true, "typ": true}

// LooksLikeJWT reports whether a token has the shape of a compact JWS: exactly
// two dots. Minted tokens have none.
func LooksLikeJWT(token string) bool { return strings.Count(token, ".") == 2 }

type k8sRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// tokenClaims is the payload of a projected token: the registered claims and
// the kubernetes.io object.
type tokenClaims struct {
	jwt.Claims
	k8sClaims
}

type k8sClaims struct {
	Kubernetes *struct {
		Namespace      string  `json:"namespace"`
		Node           *k8sRef `json:"node"`
		Pod            *k8sRef `json:"pod"`
		ServiceAccount *k8sRef `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

// Verify checks a projected ServiceAccount token, in DL-440's order:
//
//  1. parse as a compact JWS signed with RS256 or ES256 (and only alg, kid, typ headers);
//  2. select the cluster by the exact unverified iss; an unknown issuer fails without a fetch;
//  3. require a kid, select keys by it (an unknown kid may re-fetch, rate-limited) and verify the signature;
//  4. validate iss, aud, exp, nbf and iat with Leeway;
//  5. require exp and iat, and exp - iat <= maxTokenLifetime;
//  6. require the cluster's ServiceAccount in sub and in the kubernetes.io claims;
//  7. require the pod and node names;
//
// then it applies the rules every door shares: the token is refused from
// exp + Leeway on (Subject.NotAfter), and a node in the cluster's deny list
// is refused.
//
// Failures satisfy ErrUnauthenticated, or ErrKeysUnavailable when the cluster
// has no usable key set. Errors name the cluster and a fixed cause, never the token.
func (v *RunnerVerifier) Verify(ctx context.Context, token string) (Subject, error) {
	// Cheap checks first: length, shape, header.
	if len(token) > MaxTokenBytes {
		return Subject{}, unauthenticated("", errTooLong)
	}
	var key [sha256.Size]byte
	if v.cache != nil {
		key = sha256.Sum256([]byte(token))
		if sub, ok := v.cached(key); ok {
			if c := v.clusters.Load().byName[sub.Workload.Cluster]; c != nil {
				return v.review(ctx, c, token, sub)
			}
			return sub, nil
		}
	}
	if !LooksLikeJWT(token) {
		return Subject{}, unauthenticated("", errMalformed)
	}
	if err := checkHeader(token[:strings.IndexByte(token, '.')]); err != nil {
		return Subject{}, unauthenticated("", err)
	}
	// 1. The payload is decoded once; the signature check below covers these
	// exact bytes, so nothing read here is trusted before it passes.
	jws, err := jose.ParseSignedCompact(token, allowedAlgs)
	if err != nil || len(jws.Signatures) != 1 {
		return Subject{}, unauthenticated("", errMalformed)
	}
	hdr := jws.Signatures[0].Header
	var claims tokenClaims
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &claims); err != nil {
		return Subject{}, unauthenticated("", errClaims)
	}
	// 2. Exact issuer selection; an unknown issuer costs no fetch.
	c := v.clusters.Load().byIssuer[claims.Issuer]
	if c == nil {
		return Subject{}, unauthenticated("", errUnknownIssuer)
	}
	name := c.cfg.Name
	// 3.
	if hdr.KeyID == "" {
		return Subject{}, unauthenticated(name, errNoKID)
	}
	keys, snap, err := v.keysFor(ctx, c, hdr.KeyID)
	if err != nil {
		return Subject{}, err
	}
	verified := false
	for _, k := range keys {
		if !matchesAlg(k, hdr.Algorithm) {
			continue
		}
		if _, err := jws.Verify(k.Key); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		return Subject{}, unauthenticated(name, errSignature)
	}
	std := claims.Claims
	k8s := claims.k8sClaims
	// 4.
	now := v.now()
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: c.cfg.Issuer, AnyAudience: jwt.Audience{c.cfg.Audience}, Time: now}, Leeway)
	switch {
	case err == nil:
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return Subject{}, unauthenticated(name, errIssuer)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return Subject{}, unauthenticated(name, errAudience)
	case errors.Is(err, jwt.ErrExpired):
		return Subject{}, unauthenticated(name, errExpired)
	case errors.Is(err, jwt.ErrNotValidYet):
		return Subject{}, unauthenticated(name, errNotYetValid)
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Subject{}, unauthenticated(name, errIssuedInFuture)
	default:
		return Subject{}, unauthenticated(name, errClaims)
	}
	// 5. go-jose skips absent time claims.
	if std.Expiry == nil {
		return Subject{}, unauthenticated(name, errNoExp)
	}
	if std.IssuedAt == nil {
		return Subject{}, unauthenticated(name, errNoIat)
	}
	exp, iat := std.Expiry.Time(), std.IssuedAt.Time()
	if exp.Sub(iat) > c.cfg.MaxTokenLifetime {
		return Subject{}, unauthenticated(name, errLifetime)
	}
	// 6.
	if std.Subject != "system:serviceaccount:"+c.cfg.Namespace+":"+c.cfg.ServiceAccount {
		return Subject{}, unauthenticated(name, errSubject)
	}
	kc := k8s.Kubernetes
	if kc == nil || kc.Namespace != c.cfg.Namespace {
		return Subject{}, unauthenticated(name, errNamespace)
	}
	if kc.ServiceAccount == nil || kc.ServiceAccount.Name != c.cfg.ServiceAccount {
		return Subject{}, unauthenticated(name, errServiceAccount)
	}
	// 7.
	if kc.Pod == nil || kc.Pod.Name == "" {
		return Subject{}, unauthenticated(name, errNoPod)
	}
	if kc.Node == nil || kc.Node.Name == "" {
		return Subject{}, unauthenticated(name, errNoNode)
	}
	if !validNodeName(kc.Node.Name) {
		return Subject{}, unauthenticated(name, errNodeName)
	}
	// The one leeway rule (see NotAfter): go-jose still accepts at exactly
	// exp + Leeway; from that instant on the token is refused, so a door never
	// grants something that is already over.
	notAfter := exp.Add(Leeway)
	if !now.Before(notAfter) {
		return Subject{}, unauthenticated(name, errExpired)
	}
	// The per-node deny list (DL-440 OQ-1), after everything else, so only a
	// token that would otherwise be accepted learns that its node is denied.
	nodeUID := ""
	if validNodeUID(kc.Node.UID) {
		nodeUID = kc.Node.UID
	}
	deny := c.life.deny.Load()
	if err := deny.match(kc.Node.Name, nodeUID); err != nil {
		return Subject{}, unauthenticated(name, err)
	}
	sub := Subject{
		Kind:     SubjectRunner,
		ID:       WorkloadRunnerID(name, kc.Node.Name),
		Tenant:   v.tenant,
		Expiry:   exp,
		NotAfter: notAfter,
		Workload: &Workload{
			Cluster:        name,
			Namespace:      kc.Namespace,
			ServiceAccount: kc.ServiceAccount.Name,
			NodeName:       kc.Node.Name,
			NodeUID:        kc.Node.UID,
			PodName:        kc.Pod.Name,
			PodUID:         kc.Pod.UID,
			JTI:            std.ID,
			IssuedAt:       iat,
			KeyID:          hdr.KeyID,
		},
	}
	if v.cache != nil {
		notBefore := iat
		if std.NotBefore != nil && std.NotBefore.Time().After(notBefore) {
			notBefore = std.NotBefore.Time()
		}
		v.remember(key, cacheEntry{c: c, snap: snap, deny: deny, notBefore: notBefore.Add(-Leeway), sub: sub})
	}
	// The cluster's API server last (tokenReview): only a token that
	// verified offline costs a request, and the verified-token cache keeps
	// the offline result whatever the review says, which has its own.
	return v.review(ctx, c, token, sub)
}

// checkHeader refuses any JOSE header parameter other than alg, kid and typ,
// and any alg other than RS256 and ES256, before the token is parsed further.
func checkHeader(seg string) error {
	if base64.RawURLEncoding.DecodedLen(len(seg)) > maxHeaderBytes {
		return errHeader
	}
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return errMalformed
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw, &hdr); err != nil {
		return errMalformed
	}
	for k := range hdr {
		if !allowedHeaders[k] {
			return errHeader
		}
	}
	var alg string
	if err := json.Unmarshal(hdr["alg"], &alg); err != nil || !slices.Contains(allowedAlgs, jose.SignatureAlgorithm(alg)) {
		return errAlgorithm
	}
	return nil
}

// keysFor returns the keys with the given kid, re-fetching (at most once per
// cluster per KIDMissCooldown) when the kid is unknown or no set is loaded.
func (v *RunnerVerifier) keysFor(ctx context.Context, c *cluster, kid string) ([]jose.JSONWebKey, *keySnapshot, error) {
	s := c.snap.Load()
	if v.usable(c, s) == nil {
		if ks := s.keys[kid]; len(ks) > 0 {
			return ks, s, nil
		}
	}
	if !c.static && v.claimMissFetch(c) {
		if err := v.refreshFor(ctx, c, ReasonKIDMiss); err != nil && ctx.Err() != nil {
			return nil, nil, keysUnavailable(c.cfg.Name, fmt.Errorf("waiting for a key fetch: %w", ctx.Err()))
		}
		s = c.snap.Load()
	}
	if err := v.usable(c, s); err != nil {
		return nil, nil, keysUnavailable(c.cfg.Name, err)
	}
	if ks := s.keys[kid]; len(ks) > 0 {
		return ks, s, nil
	}
	return nil, nil, unauthenticated(c.cfg.Name, errUnknownKID)
}

// claimMissFetch takes the cluster's kid-miss fetch slot if the cooldown has
// passed. The slot is used up whether or not the fetch succeeds.
func (v *RunnerVerifier) claimMissFetch(c *cluster) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	if !c.lastMiss.IsZero() && now.Sub(c.lastMiss) < KIDMissCooldown {
		return false
	}
	c.lastMiss = now
	return true
}
