package verifier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Resolver is the one decision both doors (the Server's gRPC door and the NATS
// auth callout) make for a presented token. It dispatches by shape:
//
//   - a token with exactly two dots is a compact JWS: it goes to Verify only,
//     never to the minted-token store, and only a door that wants a Runner takes it;
//   - anything else is a minted token, looked up by its SHA-256.
type Resolver struct {
	verifier *RunnerVerifier // nil: no cluster registered
	tokens   TokenStore      // nil: minted tokens are not accepted
	now      func() time.Time
}

// ResolverOption configures a Resolver.
type ResolverOption func(*Resolver)

// WithResolverClock sets the clock a minted token's expiry is checked
// against. The default is the verifier's clock, so both kinds of token are
// judged by one clock, or time.Now without a verifier.
func WithResolverClock(now func() time.Time) ResolverOption {
	return func(r *Resolver) {
		if now != nil {
			r.now = now
		}
	}
}

// NewResolver returns a Resolver. Either argument may be nil: without a
// verifier every JWS-shaped token is ErrTokenNotFound; without a store every
// minted token is.
func NewResolver(v *RunnerVerifier, tokens TokenStore, opts ...ResolverOption) *Resolver {
	r := &Resolver{verifier: v, tokens: tokens, now: time.Now}
	if v != nil {
		r.now = v.now
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Resolve authenticates a presented token for a door that wants subjects of
// kind want. Failures satisfy ErrUnauthenticated (with ErrWrongKind or
// ErrTokenNotFound where they apply), or ErrKeysUnavailable.
func (r *Resolver) Resolve(ctx context.Context, token string, want SubjectKind) (Subject, error) {
	if LooksLikeJWT(token) {
		if want != SubjectRunner {
			return Subject{}, &Error{Kind: ErrWrongKind, Cause: errors.New("a projected token is for the Runner door only")}
		}
		if r.verifier == nil || len(r.verifier.clusters.Load().list) == 0 {
			return Subject{}, &Error{Kind: ErrTokenNotFound, Cause: errNoClusters}
		}
		return r.verifier.Verify(ctx, token)
	}
	// A minted token never contains "." and is never empty; anything else
	// cannot be in the store, so skip the lookup.
	if CheckMintedToken(token) != nil {
		return Subject{}, &Error{Kind: ErrTokenNotFound, Cause: errMalformed}
	}
	if r.tokens == nil {
		return Subject{}, &Error{Kind: ErrTokenNotFound, Cause: errNoStore}
	}
	m, err := r.tokens.LookupTokenHash(ctx, HashToken(token))
	switch {
	case errors.Is(err, ErrTokenNotFound):
		return Subject{}, &Error{Kind: ErrTokenNotFound}
	case err != nil:
		return Subject{}, unauthenticated("", fmt.Errorf("minted-token lookup failed: %w", err))
	case m.Revoked:
		return Subject{}, &Error{Kind: ErrTokenNotFound, Cause: errRevoked}
	case !m.ExpiresAt.IsZero() && !r.now().Before(m.ExpiresAt):
		// From its expiry on, a minted token is as dead as a revoked one:
		// the same answer as an unknown token, with the cause for the log.
		return Subject{}, &Error{Kind: ErrTokenNotFound, Cause: errExpired}
	case !m.Kind.Valid():
		return Subject{}, unauthenticated("", fmt.Errorf("stored token has unknown kind %d", int(m.Kind)))
	case m.Kind != want:
		return Subject{}, &Error{Kind: ErrWrongKind, Cause: fmt.Errorf("minted %s token on a %s door", m.Kind, want)}
	}
	if m.Kind == SubjectRunner && strings.Contains(m.ID, "/") {
		// "/" is reserved for <cluster>/<node> (DL-440): a minted row from
		// before the rule must not speak for a Kubernetes node at either door.
		return Subject{}, unauthenticated("", errReservedRunnerID)
	}
	// A minted token with a TTL bounds what a door grants on it (the NATS
	// user JWT) by its expiry, the instant Resolve starts refusing it.
	return Subject{Kind: m.Kind, ID: m.ID, Tenant: m.Tenant, Expiry: m.ExpiresAt, NotAfter: m.ExpiresAt, TokenID: m.TokenID}, nil
}
