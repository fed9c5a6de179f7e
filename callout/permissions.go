package callout

import (
	"github.com/nats-io/jwt/v2"

	"github.com/compass-runner/identity/subjects"
)

// RunnerPermissions is the user JWT permissions of a Runner: exactly
// subjects.RunnerPermissions, in nats-io/jwt's terms. Everything else is
// denied by omission.
func RunnerPermissions(runnerID string) (jwt.Permissions, error) {
	p, err := subjects.RunnerPermissions(runnerID)
	if err != nil {
		return jwt.Permissions{}, err
	}
	return jwt.Permissions{
		Pub:  jwt.Permission{Allow: jwt.StringList(p.Publish)},
		Sub:  jwt.Permission{Allow: jwt.StringList(p.Subscribe)},
		Resp: &jwt.ResponsePermission{MaxMsgs: p.ReplyMax, Expires: p.ReplyTTL},
	}, nil
}
