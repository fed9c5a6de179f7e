package callout_test

import (
	"slices"
	"testing"

	"github.com/nats-io/jwt/v2"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/subjects"
)

// The user JWT's permissions are exactly the scheme's, and valid as
// nats-io/jwt sees them.
func TestRunnerPermissions(t *testing.T) {
	p, err := callout.RunnerPermissions("prod/n1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Pub.Allow, jwt.StringList{"compass.runner.prod/n1.evt.>"}) || len(p.Pub.Deny) != 0 {
		t.Errorf("pub = %+v", p.Pub)
	}
	if !slices.Equal(p.Sub.Allow, jwt.StringList{"compass.runner.prod/n1.cmd", "compass.runner.prod/n1.inbox.>"}) || len(p.Sub.Deny) != 0 {
		t.Errorf("sub = %+v", p.Sub)
	}
	if p.Resp == nil || p.Resp.MaxMsgs != 1 || p.Resp.Expires != subjects.ReplyTTL {
		t.Errorf("resp = %+v", p.Resp)
	}
	var vr jwt.ValidationResults
	p.Validate(&vr)
	if !vr.IsEmpty() {
		t.Errorf("permissions do not validate: %v", vr.Errors())
	}
	if _, err := callout.RunnerPermissions("a.b"); err == nil {
		t.Error("a Runner ID with a dot was given permissions")
	}
}
