package callout

import (
	"github.com/nats-io/jwt/v2"

	"github.com/compass-runner/identity/subjects"
)

// What a Runner's NATS connection may use beyond its subjects. A stolen token
// buys a connection on the Runner's own subjects for at most the user JWT's
// lifetime; these bound what that connection can cost the server.
const (
	// MaxRunnerSubscriptions: a Runner holds one subscription on its cmd
	// subject and nats.go's one response-mux subscription on its inbox; four
	// leave room for a resubscribe in flight, not for fan-out.
	MaxRunnerSubscriptions = 4
	// MaxRunnerPayload: a Runner's messages are JSON commands, answers and
	// events of a few KiB; 64 KiB per message is ample for them and a
	// sixteenth of nats-server's default max_payload.
	MaxRunnerPayload = 64 << 10
)

// RunnerConnectionTypes are the connection types a Runner's user JWT allows:
// a standard client connection only (no WebSocket, MQTT or leafnode), which
// is how compass-runner connects.
var RunnerConnectionTypes = []string{jwt.ConnectionTypeStandard}

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
