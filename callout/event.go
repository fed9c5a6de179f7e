package callout

// Outcomes, drop reasons and the Event each request produces.

import "time"

// Outcome is what happened to one request.
type Outcome string

const (
	OutcomeAuthorized      Outcome = "authorized"
	OutcomeDenied          Outcome = "denied"           // answered "not authorized"
	OutcomeKeysUnavailable Outcome = "keys_unavailable" // answered "runner cluster keys unavailable"
	OutcomeDropped         Outcome = "dropped"          // not answered (see Event.Reason)
	OutcomeError           Outcome = "error"            // could not answer (encode or publish failed)
)

// Drop reasons: requests that get no answer at all.
const (
	DropExpired       = "expired"        // past its exp: the server has given up on it
	DropPastHorizon   = "past_horizon"   // past its answer horizon: the client has given up on it
	DropInvalid       = "invalid"        // bad JWT, signature, issuer, audience or user nkey
	DropSealMismatch  = "seal_mismatch"  // plain with an xkey configured, or sealed without one
	DropUndecryptable = "undecryptable"  // sealed, but not to our xkey
	DropReplayed      = "replayed"       // a user nkey already answered
	DropTooLarge      = "too_large"      // over MaxRequestBytes
	DropWrongSubject  = "wrong_callout"  // request addressed to another issuer or callout account
	DropShuttingDown  = "shutting_down"  // queued when the responder drained
	DropNoReply       = "no_reply"       // no reply subject
	DropServerXKeyMis = "xkey_not_bound" // header xkey differs from the one the server signed
	DropOverload      = "overload"       // evicted from a full queue (the oldest goes first)
)

// Event is one request's decision, for metrics and tests.
type Event struct {
	Outcome  Outcome
	Reason   string // drop reason, or the failure cause (safe to log)
	Cluster  string // cluster the token named, when known
	RunnerID string // on success
	UserNkey string // the request's user nkey, when decoded
	Sealed   bool
	Latency  time.Duration // from dequeue to answer
	// RequestExpiry is the request's exp (whole seconds; the server gives up
	// at or a little after it), when the request was decoded.
	RequestExpiry time.Time
	// Slack is, for an answered request, the time left before RequestExpiry
	// when the answer was published: how close the responder runs to the
	// server giving up. It shrinks toward zero under overload.
	Slack time.Duration
	// UserJWTExpiry is the user JWT's exp on success.
	UserJWTExpiry time.Time
	// Age is, for an answered request, the time from its arrival (its
	// delivery to the callout, moved back by the lag of the connection it
	// came on: see lag.go) to its answer being published, queueing
	// included; PastHorizon says it exceeded Config.AnswerHorizon, so the
	// client most likely failed its CONNECT before the answer came.
	Age         time.Duration
	PastHorizon bool

	// The keys of an answered request (public keys, none secret): the xkey
	// it was sealed to ("" when plain), the key that signed the answer and,
	// on success, the key that signed the user JWT. While a key rotation
	// rolls through a NATS cluster they say which configuration the
	// request's server runs (rotation.go).
	XKey, Issuer, UserIssuer string

	// On success, what the kick (package kick) needs to find and judge the
	// connection later: where it is (the server's ID, its client ID there,
	// the client's host) and what authenticated it (the node of a projected
	// token, a minted token's public ID). None of it is secret.
	ServerID   string
	ClientID   uint64
	ClientHost string
	NodeName   string
	NodeUID    string
	PodUID     string // the pod a projected token is bound to
	KeyID      string // the kid that signed a projected token
	TokenID    string
}
