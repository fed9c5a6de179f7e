package verifier

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-jose/go-jose/v4"
)

// parseJWKS takes the keys this verifier can use and logs each one it ignores.
// A set with no usable key is an error, so the last good set is kept.
func (v *RunnerVerifier) parseJWKS(cluster string, data []byte) ([]jose.JSONWebKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, errors.New("not a JSON Web Key Set")
	}
	var keys []jose.JSONWebKey
	for i, raw := range set.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			v.log.Warn("runner cluster key ignored", "cluster", cluster, "index", i, "reason", "not a JWK this verifier can parse")
			continue
		}
		if reason := unusableKey(&k); reason != "" {
			v.log.Warn("runner cluster key ignored", "cluster", cluster, "index", i, "kid", k.KeyID, "reason", reason)
			continue
		}
		if len(keys) == MaxKeysPerSet {
			v.log.Warn("runner cluster key set truncated", "cluster", cluster, "max_keys", MaxKeysPerSet)
			break
		}
		keys = append(keys, k.Public())
	}
	if len(keys) == 0 {
		return nil, errors.New("no usable signing key in the key set")
	}
	return keys, nil
}

func unusableKey(k *jose.JSONWebKey) string {
	if k.Use != "" && k.Use != "sig" {
		return fmt.Sprintf("use %q is not sig", k.Use)
	}
	if k.KeyID == "" {
		return "no kid (tokens must name their key)"
	}
	if !k.IsPublic() {
		return "private key material published in a JWKS"
	}
	switch pk := k.Key.(type) {
	case *rsa.PublicKey:
		if pk.N.BitLen() < MinRSABits {
			return fmt.Sprintf("RSA key of %d bits; at least %d required", pk.N.BitLen(), MinRSABits)
		}
		if k.Algorithm != "" && k.Algorithm != string(jose.RS256) {
			return fmt.Sprintf("RSA key for alg %q; only RS256 is accepted", k.Algorithm)
		}
	case *ecdsa.PublicKey:
		if pk.Curve != elliptic.P256() {
			return "EC key not on P-256; only ES256 is accepted"
		}
		if k.Algorithm != "" && k.Algorithm != string(jose.ES256) {
			return fmt.Sprintf("EC key for alg %q; only ES256 is accepted", k.Algorithm)
		}
	default:
		return fmt.Sprintf("key type %T is not RSA or EC", k.Key)
	}
	return ""
}

// matchesAlg reports whether a key can verify a signature of the given alg.
func matchesAlg(k jose.JSONWebKey, alg string) bool {
	switch k.Key.(type) {
	case *rsa.PublicKey:
		return alg == string(jose.RS256)
	case *ecdsa.PublicKey:
		return alg == string(jose.ES256)
	}
	return false
}
