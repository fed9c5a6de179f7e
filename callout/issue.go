package callout

// Issuing: the Runner's user JWT, validated before it is signed, and the
// signed (and sealed) response.

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/verifier"
)

// userJWT issues the Runner's user JWT, validated before it is signed.
func (r *Responder) userJWT(req *request, subj verifier.Subject) (string, time.Time, error) {
	perms, err := RunnerPermissions(subj.ID)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("runner ID is not a subject token: %w", err)
	}
	if nkeys.IsValidPublicUserKey(subj.ID) {
		// nats-server would show this user like one with a key of its own,
		// which the kicker never judges (kick.Kicker.calloutUser); minting
		// refuses such an ID (verifier.CheckSubjectID).
		return "", time.Time{}, fmt.Errorf("runner ID is a NATS user key")
	}
	exp, err := UserExpiry(r.cfg.Now(), subj.NotAfter, r.cfg.MaxLifetime)
	if err != nil {
		return "", time.Time{}, err
	}
	uc := jwt.NewUserClaims(req.claims.UserNkey)
	uc.Name = subj.ID
	uc.Audience = r.audience
	uc.Expires = exp.Unix()
	uc.Permissions = perms
	uc.AllowedConnectionTypes = jwt.StringList(RunnerConnectionTypes)
	uc.Limits.Subs = MaxRunnerSubscriptions
	uc.Limits.Payload = MaxRunnerPayload
	uc.IssuerAccount = req.keys.userIssAcct
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if len(vr.Issues) > 0 {
		return "", time.Time{}, fmt.Errorf("user JWT does not validate: %s", vr.Issues[0].Description)
	}
	tok, err := uc.Encode(req.keys.user)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("encode user JWT: %w", err)
	}
	return tok, exp, nil
}

// response encodes the answer (a user JWT or an error string), sealed when
// the request was.
func (r *Responder) response(req *request, userJWT, errStr string) ([]byte, error) {
	rc := jwt.NewAuthorizationResponseClaims(req.claims.UserNkey)
	rc.Audience = req.claims.Server.ID
	rc.Jwt = userJWT
	rc.Error = errStr
	rc.IssuerAccount = req.keys.respIssAcct
	// The server gives up at the request's expiry; the answer need not live longer.
	rc.Expires = req.claims.Expires
	tok, err := rc.Encode(req.keys.resp)
	if err != nil {
		return nil, fmt.Errorf("callout: encode response: %w", err)
	}
	data := []byte(tok)
	if req.serverKey != "" {
		if data, err = req.keys.xkey.Seal(data, req.serverKey); err != nil {
			return nil, fmt.Errorf("callout: seal response: %w", err)
		}
	}
	return data, nil
}
