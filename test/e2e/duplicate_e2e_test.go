package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// helperEnv makes the test binary a plain NATS client in a process of its
// own (see TestMain), for the copied-token test.
const helperEnv = "COMPASS_E2E_HELPER_NATS_URL"

// TestMain runs the package's tests, or, with helperEnv set, is the copied
// token's process: it connects with the token in the file
// COMPASS_E2E_HELPER_TOKEN_FILE, prints "connected", and holds the
// connection until its standard input closes.
func TestMain(m *testing.M) {
	url := os.Getenv(helperEnv)
	if url == "" {
		os.Exit(m.Run())
	}
	tok, err := os.ReadFile(os.Getenv("COMPASS_E2E_HELPER_TOKEN_FILE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: cannot read the token file")
		os.Exit(2)
	}
	nc, err := nats.Connect(url, nats.Token(strings.TrimSpace(string(tok))), nats.NoReconnect(), nats.Name("copy"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: connect failed")
		os.Exit(2)
	}
	fmt.Println("connected")
	_, _ = io.Copy(io.Discard, os.Stdin)
	nc.Close()
	os.Exit(0)
}

// A second process with a copy of a Runner's token connects, against the
// real compass-callout binary: the older connection is ended after the
// duplicate grace, the event is logged with both client addresses (never
// the token) and counted in the metric the documented alert reads.
func TestCopiedTokenInASecondProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinaries(t, "compass-callout")
	dir := t.TempDir()
	is := testkeys.Issuer(t)
	clusters := verifiertest.ClusterFile(t, dir, verifiertest.ClusterEntry(t, is, dir, "prod"))
	ns := natsembed.ServeForProcess(t, dir)
	metrics := testutil.FreeAddr(t)
	co := startProc(t, filepath.Join(bin, "compass-callout"), nil, append(ns.Env(),
		"COMPASS_RUNNER_CLUSTERS="+clusters,
		"COMPASS_METRICS_ADDR="+metrics, "COMPASS_DUPLICATE_GRACE=1s")...)
	co.waitLog(t, "compass-callout answering", 1)

	tokenFile := filepath.Join(dir, "token")
	if _, err := is.WriteTokenFile(tokenFile, kubeissuer.Pod{NodeName: "node-a"}, 0); err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	first, err := nats.Connect(ns.URL, nats.Token(strings.TrimSpace(string(tok))), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("the Runner's connection: %v", err)
	}
	defer first.Close()

	// The copy, in a process of its own.
	cp := exec.Command(os.Args[0])
	cp.Env = append(os.Environ(), helperEnv+"="+ns.URL, "COMPASS_E2E_HELPER_TOKEN_FILE="+tokenFile)
	stdin, err := cp.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cp.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cp.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "connected\n" {
		t.Fatalf("the copy did not connect: %q %v", line, err)
	}

	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("the older connection was not ended:\n%s", co.stderr)
	}
	co.waitLog(t, `"msg":"kick: runner ID has more than one live connection (a reconnect race or a copied token)"`, 1)
	co.waitLog(t, `"msg":"kick: runner connection ended"`, 1)
	res, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`compass_callout_duplicate_connections_total{action="kicked"} 1`, `compass_callout_kicks_total{reason="duplicate",result="kicked"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(co.stderr.String(), strings.TrimSpace(string(tok))) {
		t.Fatal("the callout's log holds the token")
	}
}
