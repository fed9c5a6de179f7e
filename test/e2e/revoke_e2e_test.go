package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/test/natsembed"
)

// revokeBound is the 2 s the design allows from revoke-token returning to
// the live connection closing (about 1 s measured: the store poll), with
// slack for a loaded CI machine.
const revokeBound = 6 * time.Second

// compassServer runs the compass-server binary with args and returns its
// stdout and stderr; the test fails unless it exits 0.
func compassServer(t *testing.T, bin string, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "compass-server"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("compass-server %s: %v\n%s", args[0], err, stderr.String())
	}
	return stdout.String(), stderr.String()
}

// The guide's revocation of a minted token (docs/self-host.md, "Revocation"),
// run with the real binaries: compass-server migrate and mint-runner-token,
// the compass-callout binary on the same store with its kick identity, a
// Runner connected with the token, then compass-server revoke-token: the
// live connection ends within the bound, and the callout logs the kick.
func TestRevokeTokenCommandEndsTheLiveConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server", "compass-callout")
	dir := t.TempDir()
	db := "sqlite://" + filepath.Join(dir, "compass.db")
	compassServer(t, bin, "migrate", "--database-url", db)
	out, errOut := compassServer(t, bin, "mint-runner-token", "--database-url", db, "--runner-id", "build-host-1")
	tok := strings.TrimSpace(out)
	m := regexp.MustCompile(`token ([0-9a-f]{16}) for`).FindStringSubmatch(errOut)
	if tok == "" || m == nil {
		t.Fatalf("mint-runner-token printed no token or no public ID:\n%s", errOut)
	}

	ns := natsembed.ServeForProcess(t, dir)
	co := startProc(t, filepath.Join(bin, "compass-callout"), nil, append(ns.Env(),
		"COMPASS_DATABASE_URL="+db, "COMPASS_METRICS_ADDR="+testutil.FreeAddr(t))...)
	co.waitLog(t, "compass-callout answering", 1)

	closed := make(chan time.Time, 1)
	nc, err := nats.Connect(ns.URL, nats.Token(tok), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { closed <- time.Now() }))
	if err != nil {
		t.Fatalf("the Runner's connection with the minted token: %v", err)
	}
	defer nc.Close()

	compassServer(t, bin, "revoke-token", "--database-url", db, m[1])
	revoked := time.Now()
	select {
	case at := <-closed:
		t.Logf("connection ended %s after revoke-token returned", at.Sub(revoked))
	case <-time.After(revokeBound):
		t.Fatalf("the connection was still open %s after revoke-token returned:\n%s", revokeBound, co.stderr)
	}
	co.waitLog(t, `"msg":"kick: runner connection ended"`, 1)
	if !strings.Contains(co.stderr.String(), `"reason":"token_revoked"`) {
		t.Fatalf("the kick's log line does not say token_revoked:\n%s", co.stderr)
	}
	if strings.Contains(co.stderr.String(), tok) {
		t.Fatal("the callout's log holds the token")
	}
}
