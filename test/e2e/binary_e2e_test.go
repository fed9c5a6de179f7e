package e2e

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/verifier"
)

// TestRunnerBinaryEnrollsAndDrainsOnSIGTERM runs the compass-runner binary as
// a Kubernetes pod would: only COMPASS_* variables, a token file, the door's
// CA. It must become ready, answer ping, and on SIGTERM drain and exit 0.
func TestRunnerBinaryEnrollsAndDrainsOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildRunnerBinary(t)
	s := newStack(t, stackOpts{})
	node := "node-binary"
	path := s.tokenFile(t, node)
	healthAddr := testutil.FreeAddr(t)

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"COMPASS_TOKEN_FILE="+path,
		"COMPASS_SERVER="+s.doorURL,
		"COMPASS_CA_FILE="+s.doorCA,
		"COMPASS_HEALTH_ADDR="+healthAddr,
		"COMPASS_HEARTBEAT=1s",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})

	// The process is external: poll /readyz until a deadline.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30 s:\n%s", stderr.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("exited early: %v\n%s", err, stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	id := verifier.WorkloadRunnerID(cluster, node)
	if resp, err := ping(t, s.server, id); err != nil || !resp.OK {
		t.Fatalf("ping: %+v %v", resp, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no exit 20 s after SIGTERM:\n%s", stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{`"msg":"runner: enrolled"`, `"runner_id":"` + id + `"`, "NATS connection drained and closed", `"msg":"compass-runner stopped"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %s:\n%s", want, out)
		}
	}
	tok, _ := os.ReadFile(path)
	if strings.Contains(out, strings.TrimSpace(string(tok))) {
		t.Fatal("the token appears in the log")
	}
}
