package door_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/verifier"
)

// pullBound is how soon after SIGHUP a signing key removed at the issuer
// must stop verifying at both doors (docs/verifier.md, "Pulling a key"):
// the emergency of a leaked key cannot wait for the hourly refresh.
const pullBound = 2 * time.Second

// A signing key removed at the issuer (a leaked one: the issuer rotates to a
// new key and stops publishing the old) stops verifying at both doors
// within pullBound of SIGHUP, though the cluster file is unchanged: the
// token signed with it, accepted and remembered by both doors' verified-token
// caches a moment before, is refused at Enroll and at CONNECT, and a token
// signed with the new key is accepted at both.
func TestPulledKeyStopsAtBothDoors(t *testing.T) {
	dir := t.TempDir()
	prod := testkeys.Issuer(t)
	ca, err := prod.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "clusters.yaml")
	replace(t, path, fmt.Sprintf("clusters:\n  - name: prod\n    issuer: %s\n    caFile: %s\n", prod.URL(), ca))
	operatorLoads := make(chan verifier.LoadEvent, 8)
	d := startDaemons(t, path, daemonOpts{loadHook: func(ev verifier.LoadEvent) {
		if ev.Reason == verifier.ReasonOperator {
			operatorLoads <- ev
		}
	}})

	const node = "ip-10-0-1-5.ec2.internal"
	token := func() string {
		tok, err := prod.Token(kubeissuer.Pod{NodeName: node}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	leaked := token()
	if err := d.enroll(t, leaked); err != nil {
		t.Fatalf("Enroll before the key is pulled: %v", err)
	}
	if err := d.connectNATS(t, leaked); err != nil {
		t.Fatalf("CONNECT before the key is pulled: %v", err)
	}

	kid := prod.SigningKey().KeyID
	if _, err := prod.Rotate(); err != nil {
		t.Fatal(err)
	}
	prod.Unpublish(kid)
	rotated := token()

	sent := time.Now()
	for _, hup := range []chan<- os.Signal{d.serverHUP, d.calloutHUP} {
		select {
		case hup <- os.Interrupt: // any value: the channel stands for SIGHUP
		case <-time.After(waitFor):
			t.Fatal("a daemon does not take its reload signal")
		}
	}
	// The callout reports its load through the hook, the Server in its log.
	select {
	case ev := <-operatorLoads:
		if ev.Cluster != "prod" || ev.Err != nil || ev.Keys != 1 {
			t.Fatalf("the callout's operator load: %+v, want prod's new key", ev)
		}
	case <-time.After(waitFor):
		t.Fatalf("the callout did not re-fetch prod's keys on SIGHUP:\n%s", d.calloutLog)
	}
	waitLogged(t, d.serverLog, `msg="runner cluster keys re-fetched on the operator's request" cluster=prod reason=operator keys=1`, 1)

	if err := d.enroll(t, leaked); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Enroll with the pulled key: %v, want Unauthenticated", err)
	}
	if err := d.connectNATS(t, leaked); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("CONNECT with the pulled key: %v, want %v", err, nats.ErrAuthorization)
	}
	if took := time.Since(sent); took > pullBound {
		t.Fatalf("the pulled key was refused at both doors %v after SIGHUP, want within %v", took, pullBound)
	} else {
		t.Logf("the pulled key was refused at both doors %v after SIGHUP", took)
	}
	if err := d.enroll(t, rotated); err != nil {
		t.Fatalf("Enroll with the new key: %v", err)
	}
	if err := d.connectNATS(t, rotated); err != nil {
		t.Fatalf("CONNECT with the new key: %v", err)
	}
	d.running(t)
}
