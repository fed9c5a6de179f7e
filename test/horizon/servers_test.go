// Package horizon pins the real time budget of a CONNECT through the auth
// callout: nats-server arms a client's first PING (about 2 s) before it asks
// the callout, and nats.go fails a CONNECT whose first answer is that PING.
// The tests run the real nats-server binary (COMPASS_TEST_NATS_SERVER) and an
// in-process server, both from deploy/nats/server-config.conf with fresh
// keys, in front of the real callout.
package horizon

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/test/natsembed"
)

// Limits of the harness, each with its reason.
const (
	// waitFor bounds every other wait (a callout decision, a connect). The
	// slowest thing waited for is a 2.6 s answer.
	waitFor = 15 * time.Second
)

// deployConfig is the shipped server-config mode configuration.
const deployConfig = "../../deploy/nats/server-config.conf"

// The users deploy/nats/server-config.conf names.
const (
	calloutUser = "compass-callout"
	runnersAcct = "RUNNERS"
)

// keys are the fresh keys and passwords one test's servers are configured with.
type keys struct {
	signer          *callout.Signer // the auth_callout issuer
	xkey            *callout.XKey
	calloutPassword string
	serverPassword  string
	kickPassword    string
}

func freshKeys(t *testing.T) keys {
	t.Helper()
	signer, xkey := natsembed.Keys(t)
	return keys{signer: signer, xkey: xkey, calloutPassword: password(t), serverPassword: password(t), kickPassword: password(t)}
}

func password(t *testing.T) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// config is deploy/nats/server-config.conf as shipped, with its variables
// defined above it (as its header allows) and its fixed port replaced by a
// random loopback one.
func (k keys) config(t *testing.T) string {
	t.Helper()
	shipped, err := os.ReadFile(deployConfig)
	if err != nil {
		t.Fatal(err)
	}
	const port = "\nport: 4222\n"
	if strings.Count(string(shipped), port) != 1 {
		t.Fatalf("%s no longer has one %q line for the test to replace", deployConfig, strings.TrimSpace(port))
	}
	body := strings.Replace(string(shipped), port, "\nlisten: \"127.0.0.1:-1\"\n", 1)
	vars := fmt.Sprintf("COMPASS_CALLOUT_ISSUER: %q\nCOMPASS_CALLOUT_XKEY: %q\nCOMPASS_CALLOUT_NATS_PASSWORD: %q\nCOMPASS_SERVER_NATS_PASSWORD: %q\nCOMPASS_KICK_NATS_PASSWORD: %q\n",
		k.signer.Public(), k.xkey.Public(), k.calloutPassword, k.serverPassword, k.kickPassword)
	return vars + body
}

// onBothServers runs test twice, in parallel subtests: on the real
// nats-server binary and on an in-process server. serve runs the
// configuration it is given and returns the server's client URL.
func onBothServers(t *testing.T, test func(t *testing.T, serve func(*testing.T, string) string)) {
	t.Helper()
	for _, srv := range []struct {
		name  string
		serve func(*testing.T, string) string
	}{
		{"binary", startBinary},
		{"embedded", startEmbedded},
	} {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			test(t, srv.serve)
		})
	}
}

// startBinary runs the real nats-server (natsembed.StartProcess) on conf and
// returns its client URL.
func startBinary(t *testing.T, conf string) string {
	t.Helper()
	return natsembed.StartProcess(t, conf).URL
}

// startEmbedded runs conf in-process (natsembed.Serve) with nothing changed:
// the short first PING stays on, as it is for every server a config file
// configures (only an embedding program can turn it off).
func startEmbedded(t *testing.T, conf string) string {
	t.Helper()
	ns := natsembed.Serve(t, conf, func(o *server.Options) {
		if o.DisableShortFirstPing {
			t.Fatal("the configuration disabled the short first PING")
		}
	})
	return ns.ClientURL()
}

// startCallout runs the real callout, configured as compass-callout is for
// server-config.conf (--mode server-config --account RUNNERS, xkey), against
// url. mod adjusts its configuration. It drains when the test ends.
func startCallout(t *testing.T, url string, k keys, mod func(*callout.Config)) *callout.Responder {
	t.Helper()
	return startCalloutOn(t, connectCallout(t, url, k), k, mod)
}

// connectCallout opens the callout user's connection to url; it closes when
// the test ends.
func connectCallout(t *testing.T, url string, k keys) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(calloutUser, k.calloutPassword), nats.Name("compass-callout"))
	if err != nil {
		t.Fatalf("callout user connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startCalloutOn is startCallout on a connection already open.
func startCalloutOn(t *testing.T, nc *nats.Conn, k keys, mod func(*callout.Config)) *callout.Responder {
	t.Helper()
	cfg := callout.Config{Mode: callout.ModeServerConfig, ResponseSigner: k.signer, Account: runnersAcct, XKey: k.xkey, Workers: 4}
	if mod != nil {
		mod(&cfg)
	}
	r, err := callout.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	natsembed.StartResponder(t, r, nc)
	return r
}

// decision is one callout decision and when the callout reported it (just
// after publishing its answer).
type decision struct {
	callout.Event
	at time.Time
}

// events collects the callout's decisions for a test to wait on.
type events chan decision

func newEvents() events { return make(events, 16) }

func (e events) observe(ev callout.Event) {
	select {
	case e <- decision{ev, time.Now()}:
	default:
		panic("test/horizon: more callout decisions than the test expects")
	}
}

// next waits for the callout's next decision.
func (e events) next(t *testing.T) decision {
	t.Helper()
	select {
	case d := <-e:
		return d
	case <-time.After(waitFor):
		t.Fatalf("no callout decision within %v", waitFor)
	}
	return decision{}
}

// none checks the callout decided nothing more.
func (e events) none(t *testing.T) {
	t.Helper()
	select {
	case d := <-e:
		t.Fatalf("unexpected callout decision %s (%s)", d.Outcome, d.Reason)
	default:
	}
}
