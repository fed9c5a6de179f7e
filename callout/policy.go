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

var (
	// errTokenInLeeway: the token's exp has passed; the verifier accepted it only
	// inside its clock-skew leeway. Such a token gets no user JWT (DL-316).
	errTokenInLeeway = errors.New("token past its exp (accepted only inside the verifier leeway)")
	// errTokenEnding: the token expires within the current second, so no user
	// JWT with a whole-second expiry in the future can be issued.
	errTokenEnding = errors.New("token expires within the second")
)

// UserExpiry applies the DL-316 lifetime policy: the user JWT expires at the
// earlier of the token's exp and now+max, never later than the token; a token
// already past its exp gets none; a minted token (zero exp) gets now+max.
// JWT times are whole seconds, so the result is truncated to the second and
// must still be after now.
func UserExpiry(now, tokenExp time.Time, max time.Duration) (time.Time, error) {
	limit := now.Add(max)
	if !tokenExp.IsZero() {
		if !tokenExp.After(now) {
			return time.Time{}, errTokenInLeeway
		}
		if tokenExp.Before(limit) {
			limit = tokenExp
		}
	}
	exp := time.Unix(limit.Unix(), 0)
	if exp.Unix() <= now.Unix() {
		return time.Time{}, errTokenEnding
	}
	return exp, nil
}
