package verifier

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/compass-runner/identity/subjects"
)

// MintedTokenBytes is the entropy of a minted token: 256 bits, so a token can be
// stored and looked up by its unsalted SHA-256 alone.
const MintedTokenBytes = 32

// MaxSubjectIDLen bounds minted Runner IDs and account names. Subject IDs end up
// in NATS subjects and log lines; 128 bytes is ample for a host name.
const MaxSubjectIDLen = 128

// ErrInvalidArgument marks a token or subject ID that may not be minted or stored.
var ErrInvalidArgument = errors.New("verifier: invalid argument")

// MintedToken is what a store knows about a minted token, found by its hash.
type MintedToken struct {
	Kind    SubjectKind
	ID      string
	Tenant  string
	Revoked bool
	// TokenID is the token's public ID (the store's, unrelated to the token
	// and its hash): what an operator revokes, and what a door that keeps a
	// grant alive remembers so it can end the grant when the token is revoked.
	TokenID string
	// ExpiresAt is when the token stops resolving (minted with a TTL); zero:
	// it never expires. Resolve refuses it from this instant on and bounds
	// Subject.NotAfter by it.
	ExpiresAt time.Time
}

// TokenStore looks a minted token up by the SHA-256 of the token. It returns
// ErrTokenNotFound (possibly wrapped) when no token has that hash. The
// implementations live with the Server.
type TokenStore interface {
	LookupTokenHash(ctx context.Context, hash [sha256.Size]byte) (MintedToken, error)
}

// GenerateToken returns a new minted token: 32 random bytes in
// base64.RawURLEncoding, which has no "." and so never looks like a JWS.
func GenerateToken() (string, error) {
	var b [MintedTokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("verifier: generate token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// HashToken is the SHA-256 under which a minted token is stored.
func HashToken(token string) [sha256.Size]byte {
	return sha256.Sum256([]byte(token))
}

// CheckMintedToken refuses a token that could be stored but never resolve: one
// containing "." (Resolve sends JWS-shaped tokens to Verify, never to the store)
// or an empty one. The error never quotes the token.
func CheckMintedToken(token string) error {
	switch {
	case token == "":
		return fmt.Errorf("%w: empty token", ErrInvalidArgument)
	case strings.Contains(token, "."):
		return fmt.Errorf("%w: a minted token may not contain \".\"", ErrInvalidArgument)
	case len(token) > MaxTokenBytes:
		return fmt.Errorf("%w: token longer than %d bytes", ErrInvalidArgument, MaxTokenBytes)
	}
	return nil
}

// looksLikeNATSUserKey reports whether id has the shape of a NATS user
// public key: "U" and 55 more characters of base32's alphabet. The shape,
// not the checksum (the verifier takes no NATS dependency), so it refuses a
// little more than the kicker's test (kick, nkeys.IsValidPublicUserKey),
// never less.
func looksLikeNATSUserKey(id string) bool {
	if len(id) != 56 || id[0] != 'U' {
		return false
	}
	for _, c := range id {
		if !('A' <= c && c <= 'Z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

// CheckSubjectID refuses a minted subject ID that is empty, too long, not a
// single NATS subject token, or (for Runners) contains "/", which is reserved
// for workload Runner IDs (<cluster>/<node>), or is a NATS user public key.
func CheckSubjectID(kind SubjectKind, id string) error {
	if !kind.Valid() {
		return fmt.Errorf("%w: unknown subject kind %d", ErrInvalidArgument, int(kind))
	}
	if len(id) > MaxSubjectIDLen {
		return fmt.Errorf("%w: %s ID longer than %d bytes", ErrInvalidArgument, kind, MaxSubjectIDLen)
	}
	if err := subjects.ValidSubjectToken(id); err != nil {
		return fmt.Errorf("%w: %s ID %q: %w", ErrInvalidArgument, kind, id, err)
	}
	if kind == SubjectRunner && strings.Contains(id, "/") {
		return fmt.Errorf("%w: runner ID %q: \"/\" is reserved for Kubernetes Runner IDs (<cluster>/<node>)", ErrInvalidArgument, id)
	}
	if kind == SubjectRunner && looksLikeNATSUserKey(id) {
		// The kicker tells the callout's users from every other by it:
		// nats-server shows a user with a key of its own by that key.
		return fmt.Errorf("%w: runner ID %q is a NATS user key, which names users the callout did not issue", ErrInvalidArgument, id)
	}
	return nil
}
