package callout

import (
	"errors"
	"time"
)

// DefaultMaxLifetime is the default cap on a user JWT's lifetime (DL-316). A
// projected token lives 600 s and is rotated at ~80 %; ten minutes never
// outlives it, and a minted token (no expiry) is re-checked at least this often.
const DefaultMaxLifetime = 10 * time.Minute

// MinMaxLifetime is the least configurable cap. A user JWT's exp has whole
// seconds and is truncated down, so below two seconds it could already be due
// when issued. (Caps this short are for tests; a Runner with one would spend
// its life reconnecting.)
const MinMaxLifetime = 2 * time.Second

// MaxMaxLifetime is the greatest configurable cap. A user JWT is a grant the
// NATS server honours until its exp whatever happens after: a kick ends the
// connection at once when a node is denied or a minted token revoked, and this
// cap bounds the exposure when every kick is lost (no kick identity, a NATS
// system account that is down). An hour is also how long a key removed at an
// issuer stays trusted without an operator's reload (the hourly refresh), so
// no grant outlives the slowest revocation path the verifier already has.
const MaxMaxLifetime = time.Hour

var (
	// errTokenOver: the instant after which nothing granted on the token may
	// last (verifier.Subject.NotAfter) has passed between the decision and the
	// answer. Resolve refuses such a token itself; this is the last guard.
	errTokenOver = errors.New("token past the end of what it may be granted (exp plus the verifier leeway)")
	// errTokenEnding: the bound falls within the current second, so no user
	// JWT with a whole-second expiry in the future can be issued.
	errTokenEnding = errors.New("token expires within the second")
)

// UserExpiry applies the DL-316 lifetime policy to a decision's bound: the
// user JWT expires at the earlier of notAfter (verifier.Subject.NotAfter: the
// token's exp plus the verifier's leeway, the same instant at which every door
// starts refusing the token) and now+max; a bound already passed gets none; a
// minted token (zero bound) gets now+max. JWT times are whole seconds, so the
// result is truncated to the second and must still be after now.
func UserExpiry(now, notAfter time.Time, max time.Duration) (time.Time, error) {
	limit := now.Add(max)
	if !notAfter.IsZero() {
		if !notAfter.After(now) {
			return time.Time{}, errTokenOver
		}
		if notAfter.Before(limit) {
			limit = notAfter
		}
	}
	exp := time.Unix(limit.Unix(), 0)
	if exp.Unix() <= now.Unix() {
		return time.Time{}, errTokenEnding
	}
	return exp, nil
}
