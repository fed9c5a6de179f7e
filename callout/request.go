package callout

// Request checks: the authorization request's seal, signature, audience,
// expiry and replay, before any token is looked at.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// check opens and validates a request that arrived at arrived. A non-empty
// reason means drop it.
func (r *Responder) check(hdrKey string, data []byte, arrived time.Time) (*request, string) {
	if len(data) > MaxRequestBytes {
		return nil, DropTooLarge
	}
	xk := -1 // the held xkey that opened the request; -1: plain
	switch {
	case r.cfg.XKey != nil && hdrKey == "":
		return nil, DropSealMismatch
	case r.cfg.XKey == nil && hdrKey != "":
		return nil, DropSealMismatch
	case hdrKey != "":
		opened, i, ok := r.open(data, hdrKey)
		if !ok {
			return nil, DropUndecryptable
		}
		data, xk = opened, i
	}
	// Before the signature check, the cheap part: a request the server or
	// the client is about to give up on is not worth verifying (under
	// overload this is most of what is dropped). The unverified exp can only
	// make us drop.
	exp, ok := peekExpiry(data)
	if !ok {
		return nil, DropInvalid
	}
	if reason := r.late(r.cfg.Now(), time.Unix(exp, 0), arrived); reason != "" {
		return nil, reason
	}
	// Decode verifies the signature against the issuer in the claims and that
	// the issuer is a server nkey.
	claims, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, DropInvalid
	}
	req := &request{claims: claims, serverKey: hdrKey}
	keys, addressed := r.keysFor(claims.Subject, xk)
	req.keys = keys
	vr := jwt.CreateValidationResults()
	claims.Validate(vr) // user nkey shape; times are checked below with our clock
	switch {
	case !nkeys.IsValidPublicServerKey(claims.Issuer):
		return req, DropInvalid
	case claims.Audience != RequestAudience:
		return req, DropInvalid
	case claims.Server.ID != claims.Issuer:
		// The server signs with the key its ID is; the answer's audience is
		// that ID, so it must be the signer.
		return req, DropInvalid
	case !nkeys.IsValidPublicUserKey(claims.UserNkey):
		return req, DropInvalid
	case !addressed:
		return req, DropWrongSubject
	case claims.Expires <= 0:
		return req, DropInvalid
	case hdrKey != "" && claims.Server.XKey != hdrKey:
		return req, DropServerXKeyMis
	}
	for _, is := range vr.Issues {
		if !is.TimeCheck {
			return req, DropInvalid
		}
	}
	now := r.cfg.Now()
	req.exp, req.arrived = time.Unix(claims.Expires, 0), arrived
	req.resolveBy = r.resolveBy(req.exp, arrived)
	if reason := r.late(now, req.exp, arrived); reason != "" {
		return req, reason
	}
	if claims.NotBefore > 0 && now.Unix() < claims.NotBefore {
		return req, DropInvalid
	}
	if !r.firstUse(claims.UserNkey, claims.Expires, now.Unix()) {
		return req, DropReplayed
	}
	return req, ""
}

// resolveBy is when the resolver must be done with a request: its deadline,
// the earlier of exp and arrival plus the answer horizon, less the time to
// answer.
func (r *Responder) resolveBy(exp, arrived time.Time) time.Time {
	deadline := arrived.Add(r.cfg.AnswerHorizon)
	if exp.Before(deadline) {
		deadline = exp
	}
	return deadline.Add(-answerReserve)
}

// late says why a request cannot be answered in time any more, or "": its
// resolver would have less than minRemaining. DropExpired when exp is the
// nearer bound (the server gives up), DropPastHorizon when the horizon is
// (the client does).
func (r *Responder) late(now, exp, arrived time.Time) string {
	by := r.resolveBy(exp, arrived)
	if now.Add(minRemaining).Before(by) {
		return ""
	}
	if by.Equal(exp.Add(-answerReserve)) {
		return DropExpired
	}
	return DropPastHorizon
}

// peekExpiry reads a JWT's exp without verifying anything.
func peekExpiry(tok []byte) (int64, bool) {
	first := bytes.IndexByte(tok, '.')
	if first < 0 {
		return 0, false
	}
	rest := tok[first+1:]
	second := bytes.IndexByte(rest, '.')
	if second < 0 {
		return 0, false
	}
	payload := make([]byte, base64.RawURLEncoding.DecodedLen(second))
	n, err := base64.RawURLEncoding.Decode(payload, rest[:second])
	if err != nil {
		return 0, false
	}
	var c struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload[:n], &c); err != nil || c.Exp <= 0 {
		return 0, false
	}
	return c.Exp, true
}

// firstUse records a user nkey and reports whether it was new. The server
// creates a fresh user nkey for every CONNECT, so a second request with the
// same one is a replay.
func (r *Responder) firstUse(userNkey string, exp, now int64) bool {
	r.replayMu.Lock()
	defer r.replayMu.Unlock()
	if now >= r.replayGC || len(r.replay) >= maxReplaySet {
		for k, e := range r.replay {
			if e < now || len(r.replay) >= maxReplaySet {
				delete(r.replay, k)
			}
		}
		r.replayGC = now + 1
	}
	if _, seen := r.replay[userNkey]; seen {
		return false
	}
	r.replay[userNkey] = exp
	return true
}
