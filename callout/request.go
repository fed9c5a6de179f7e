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

// check opens and validates a request. A non-empty reason means drop it.
func (r *Responder) check(hdrKey string, data []byte) (*request, string) {
	if len(data) > MaxRequestBytes {
		return nil, DropTooLarge
	}
	switch {
	case r.cfg.XKey != nil && hdrKey == "":
		return nil, DropSealMismatch
	case r.cfg.XKey == nil && hdrKey != "":
		return nil, DropSealMismatch
	case hdrKey != "":
		opened, err := r.cfg.XKey.Open(data, hdrKey)
		if err != nil {
			return nil, DropUndecryptable
		}
		data = opened
	}
	// Before the signature check, the cheap part: a request the server is
	// about to give up on is not worth verifying (under overload this is most
	// of what is dropped). The unverified exp can only make us drop.
	if exp, ok := peekExpiry(data); !ok {
		return nil, DropInvalid
	} else if !r.cfg.Now().Add(minRemaining).Before(time.Unix(exp, 0)) {
		return nil, DropExpired
	}
	// Decode verifies the signature against the issuer in the claims and that
	// the issuer is a server nkey.
	claims, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, DropInvalid
	}
	req := &request{claims: claims, serverKey: hdrKey}
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
	case claims.Subject != r.reqSubject:
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
	req.exp = time.Unix(claims.Expires, 0)
	if !now.Before(req.exp) {
		return req, DropExpired
	}
	if claims.NotBefore > 0 && now.Unix() < claims.NotBefore {
		return req, DropInvalid
	}
	if !r.firstUse(claims.UserNkey, claims.Expires, now.Unix()) {
		return req, DropReplayed
	}
	return req, ""
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
