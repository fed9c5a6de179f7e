package deploy

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/compass-runner/identity/test/natsembed"
)

// natsBinary is the real nats-server (natsembed.Binary): the test fails
// under CI, where .ci/test installs it, and skips otherwise.
func natsBinary(t *testing.T) string {
	t.Helper()
	return natsembed.Binary(t)
}

// checkConfig runs `nats-server -t -c` on conf with exactly env as its
// environment and returns its combined output and whether it accepted the
// configuration.
func checkConfig(t *testing.T, conf []byte, env map[string]string) (string, bool) {
	t.Helper()
	bin := natsBinary(t)
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "-t", "-c", path)
	cmd.Env = []string{}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.String(), err == nil && strings.Contains(out.String(), "nats-server: configuration file "+path+" is valid")
}

// The passwords the callout, the Server and the kick identity send.
const (
	calloutTestPassword = "callout-test-password"
	serverTestPassword  = "server-test-password"
	kickTestPassword    = "kick-test-password"
)

// testPasswordHash is what Secret compass-nats-users holds for pw, as
// compass-server nats-password-hash writes it (newline included), at
// bcrypt's least cost to keep the tests quick: the cost is not what they
// test.
func testPasswordHash(pw string) string {
	h, err := natsPasswordHash(pw, bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return h + "\n"
}

// usersSecret is Secret compass-nats-users as docs/self-host.md makes it:
// bcrypt hashes of the three passwords.
var usersSecret = map[string]string{
	NATSUsersSecret + "/callout-password": testPasswordHash(calloutTestPassword),
	NATSUsersSecret + "/server-password":  testPasswordHash(serverTestPassword),
	NATSUsersSecret + "/kick-password":    testPasswordHash(kickTestPassword),
}

// userPasswordEnv is nats-server's environment from Secret compass-nats-users:
// the hashes of the passwords of the callout, the Server and the kick
// identity.
var userPasswordEnv = map[string]string{
	"COMPASS_CALLOUT_NATS_PASSWORD": usersSecret[NATSUsersSecret+"/callout-password"],
	"COMPASS_SERVER_NATS_PASSWORD":  usersSecret[NATSUsersSecret+"/server-password"],
	"COMPASS_KICK_NATS_PASSWORD":    usersSecret[NATSUsersSecret+"/kick-password"],
}

// The real nats-server v2.15 binary accepts the rendered single-server and
// cluster configurations with the Secrets' values in its environment and
// the certificates where the Secrets are mounted, and refuses them without a
// value they reference or with the placeholder keys.
func TestNATSBinary_AcceptsRenderedConfigs(t *testing.T) {
	issuer := publicKey(t, nkeys.CreateAccount)
	xkey := publicKey(t, nkeys.CreateCurveKeys)

	single := DefaultParams()
	single.NATSCalloutIssuer, single.NATSCalloutXKey = issuer, xkey
	conf, _ := withTestCerts(t, mustNATSConfig(t, single), false)
	if out, ok := checkConfig(t, conf, userPasswordEnv); !ok {
		t.Fatalf("nats-server -t refuses the single-server configuration:\n%s", out)
	}
	if out, ok := checkConfig(t, conf, map[string]string{"COMPASS_CALLOUT_NATS_PASSWORD": "x"}); ok || !strings.Contains(out, "variable reference for 'COMPASS_SERVER_NATS_PASSWORD'") {
		t.Fatalf("nats-server -t without COMPASS_SERVER_NATS_PASSWORD: accepted %v\n%s", ok, out)
	}
	noKick := maps.Clone(userPasswordEnv)
	delete(noKick, "COMPASS_KICK_NATS_PASSWORD")
	if out, ok := checkConfig(t, conf, noKick); ok || !strings.Contains(out, "variable reference for 'COMPASS_KICK_NATS_PASSWORD'") {
		t.Fatalf("nats-server -t without COMPASS_KICK_NATS_PASSWORD: accepted %v\n%s", ok, out)
	}
	placeholders, _ := withTestCerts(t, mustNATSConfig(t, DefaultParams()), false)
	if out, ok := checkConfig(t, placeholders, userPasswordEnv); ok || !strings.Contains(out, "REPLACE_WITH_CALLOUT_") {
		t.Fatalf("nats-server -t on the placeholder keys: accepted %v\n%s", ok, out)
	}

	for _, replicas := range []int{0, 5} {
		t.Run(fmt.Sprintf("cluster of %d", max(replicas, DefaultNATSClusterReplicas)), func(t *testing.T) {
			p := clusterParams(t, issuer, xkey)
			p.NATSReplicas = replicas
			conf, _ := withTestCerts(t, mustNATSConfig(t, p), true)
			env := clusterPodEnv(t, p, testRoutePassword)
			if out, ok := checkConfig(t, conf, env); !ok {
				t.Fatalf("nats-server -t refuses the cluster configuration:\n%s", out)
			}
			delete(env, natsRouteURLsEnv)
			if out, ok := checkConfig(t, conf, env); ok || !strings.Contains(out, "variable reference for '"+natsRouteURLsEnv+"'") {
				t.Fatalf("nats-server -t without %s: accepted %v\n%s", natsRouteURLsEnv, ok, out)
			}
			if strings.Contains(string(conf), testRoutePassword) {
				t.Fatal("the route password is in the configuration")
			}
		})
	}
}
