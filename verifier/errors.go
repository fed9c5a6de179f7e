package verifier

import (
	"errors"
	"strings"
)

// The failure shape callers see. Every failure returned by Verify and Resolve
// satisfies errors.Is(err, ErrUnauthenticated), except a known cluster whose keys
// are unusable, which satisfies errors.Is(err, ErrKeysUnavailable) alone. Doors map
// the first to Unauthenticated and the second to Unavailable (which Runners retry).
var (
	// ErrUnauthenticated is the one answer for every token that does not verify.
	ErrUnauthenticated = errors.New("verifier: unauthenticated")

	// ErrKeysUnavailable means the token names a registered cluster whose key set
	// was never fetched, was discarded as stale, or shares a key with another
	// cluster. It reveals nothing about the token.
	ErrKeysUnavailable = errors.New("verifier: runner cluster keys unavailable")

	// ErrWrongKind means the token is for a different kind of subject than the
	// door wants (a projected token on an account door, a Runner token on the
	// admin door). It also satisfies ErrUnauthenticated.
	ErrWrongKind = errors.New("verifier: token is for another kind of subject")

	// ErrTokenNotFound means no minted token has that hash, the token was
	// revoked, or a JWS-shaped token arrived where no cluster is registered.
	// It also satisfies ErrUnauthenticated.
	ErrTokenNotFound = errors.New("verifier: token not found")
)

// Error is a verification failure. Its message names the cluster (when one was
// selected) and a fixed cause chosen by this package; it never contains the token
// or any part of it, so callers may log it as is.
type Error struct {
	// Cluster is the registered cluster the token named, or "" when none was
	// selected (an unknown issuer, a minted token, a malformed token).
	Cluster string
	// Kind is one of the package's sentinel errors.
	Kind error
	// Cause is a short fixed description, safe to log.
	Cause error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if e.Cluster != "" {
		b.WriteString(": cluster ")
		b.WriteString(e.Cluster)
	}
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// Unwrap lets errors.Is see the kind, ErrUnauthenticated for ErrWrongKind and
// ErrTokenNotFound, and the cause.
func (e *Error) Unwrap() []error {
	errs := []error{e.Kind}
	if e.Kind == ErrWrongKind || e.Kind == ErrTokenNotFound {
		errs = append(errs, ErrUnauthenticated)
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// ClusterOf returns the cluster a verification failure names, or "".
func ClusterOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Cluster
	}
	return ""
}

func unauthenticated(cluster string, cause error) error {
	return &Error{Cluster: cluster, Kind: ErrUnauthenticated, Cause: cause}
}

func keysUnavailable(cluster string, cause error) error {
	return &Error{Cluster: cluster, Kind: ErrKeysUnavailable, Cause: cause}
}

// Causes. They are fixed strings so that no parser's message, which may quote
// the input, ever reaches a log.
var (
	errTooLong        = errors.New("token longer than MaxTokenBytes")
	errMalformed      = errors.New("malformed compact JWS")
	errHeader         = errors.New("header parameter not allowed")
	errAlgorithm      = errors.New("signature algorithm not allowed")
	errUnknownIssuer  = errors.New("unknown issuer")
	errNoKID          = errors.New("empty kid")
	errUnknownKID     = errors.New("no key with that kid")
	errSignature      = errors.New("bad signature")
	errClaims         = errors.New("malformed claims")
	errIssuer         = errors.New("issuer mismatch")
	errAudience       = errors.New("audience mismatch")
	errExpired        = errors.New("token expired")
	errNotYetValid    = errors.New("token not valid yet")
	errIssuedInFuture = errors.New("token issued in the future")
	errNoExp          = errors.New("exp claim missing")
	errNoIat          = errors.New("iat claim missing")
	errLifetime       = errors.New("exp - iat exceeds maxTokenLifetime")
	errSubject        = errors.New("sub is not the Runner ServiceAccount")
	errNamespace      = errors.New("kubernetes.io namespace mismatch")
	errServiceAccount = errors.New("kubernetes.io serviceaccount mismatch")
	errNoPod          = errors.New("kubernetes.io pod name missing")
	errNoNode         = errors.New("kubernetes.io node name missing")
	errNodeName       = errors.New("kubernetes.io node name is not an RFC 1123 name")
	errNeverFetched   = errors.New("key set not loaded yet")
	errStale          = errors.New("key set discarded after 24h without a successful fetch")
	errSharedKey      = errors.New("a signing key is shared with another cluster")
	errRevoked        = errors.New("token revoked")
	errNoClusters     = errors.New("no runner cluster is registered")
	errNoStore        = errors.New("no minted-token store")
	// The cluster's API server, asked about a token (tokenReview).
	errReviewRejected    = errors.New("the cluster's API server no longer accepts the token (its pod is gone)")
	errReviewPod         = errors.New("the cluster's API server binds the token to another pod")
	errReviewUnavailable = errors.New("the cluster's API server could not review the token")
	errPodGone           = errors.New("the token's pod is gone (the cluster's pod watch)")
	// errReservedRunnerID: a minted Runner token whose ID has "/", which is
	// reserved for Kubernetes Runner IDs; minted before the rule existed.
	errReservedRunnerID = errors.New("minted runner ID contains \"/\", reserved for <cluster>/<node>")
)
