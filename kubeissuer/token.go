package kubeissuer

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/internal/lib/atomicfile"
)

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
