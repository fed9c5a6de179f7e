package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/verifier"
)

// buildRunnerBinary builds compass-runner into a temporary directory.
func buildRunnerBinary(t *testing.T) string {
	t.Helper()
	return filepath.Join(buildBinaries(t, "compass-runner"), "compass-runner")
}

// buildBinaries builds the named daemons (cmd/<name>) into a directory the
// test removes, and returns it.
func buildBinaries(t *testing.T, names ...string) string {
	t.Helper()
	bin := t.TempDir()
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "github.com/compass-runner/identity/cmd/"+n)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// runToExit runs bin with env added to the test's environment and returns
// its exit code and stderr; a process still running after 30 s is killed
// (exit code -1).
func runToExit(t *testing.T, bin string, env ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), env...)
	return exitOf(t, cmd)
}

// exitOf runs cmd with its stderr kept and returns its exit code and
// stderr; a command that cannot be started fails the test.
func exitOf(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("run %s: %v", cmd.Args, err)
	return 0, ""
}

// TestRunnerBinaryReadsTheRecordsTokenFileVariable runs the compass-runner
// binary with its token file named only by COMPASS_RUNNER_TOKEN_FILE, the
// name DL-440 gives it and the DaemonSet sets: it enrolls with that file's
// token and answers ping. With COMPASS_RUNNER_TOKEN as well it refuses both
// token sources, and with COMPASS_TOKEN_FILE naming another file it refuses
// the two variables; both exit 2 without showing a token.
func TestRunnerBinaryReadsTheRecordsTokenFileVariable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	// Only the variables each case sets name a token.
	t.Setenv("COMPASS_TOKEN_FILE", "")
	t.Setenv("COMPASS_RUNNER_TOKEN", "")
	t.Setenv("COMPASS_RUNNER_TOKEN_FILE", "")
	bin := buildRunnerBinary(t)
	s := newStack(t, stackOpts{})
	node := "node-record-env"
	path := s.tokenFile(t, node)
	tok, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))

	t.Run("enrolls", func(t *testing.T) {
		id := verifier.WorkloadRunnerID(cluster, node)
		// A heartbeat is published on the connection after the command
		// subscription: once one arrives, ping finds the Runner.
		subj, err := subjects.Event(id, "heartbeat")
		if err != nil {
			t.Fatal(err)
		}
		beats := make(chan *nats.Msg, 64)
		sub, err := s.server.ChanSubscribe(subj, beats)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := s.server.Flush(); err != nil {
			t.Fatal(err)
		}
		p := startProc(t, bin, nil,
			"COMPASS_RUNNER_TOKEN_FILE="+path,
			"COMPASS_SERVER="+s.doorURL,
			"COMPASS_CA_FILE="+s.doorCA,
			"COMPASS_HEALTH_ADDR="+testutil.FreeAddr(t),
			"COMPASS_HEARTBEAT=1s",
		)
		select {
		case <-beats:
		case err := <-p.exited:
			p.exited <- err // for the cleanup
			t.Fatalf("exited (%v) before a heartbeat:\n%s", err, p.stderr)
		case <-time.After(30 * time.Second):
			t.Fatalf("no heartbeat from %s within 30 s:\n%s", id, p.stderr)
		}
		if resp, err := ping(t, s.server, id); err != nil || !resp.OK {
			t.Fatalf("ping: %+v %v", resp, err)
		}
		out := p.stderr.String()
		for _, want := range []string{`"token_source":"file"`, `"msg":"runner: enrolled"`, `"runner_id":"` + id + `"`} {
			if !strings.Contains(out, want) {
				t.Fatalf("log lacks %s:\n%s", want, out)
			}
		}
		if strings.Contains(out, token) {
			t.Fatal("the token appears in the log")
		}
	})

	t.Run("both token sources", func(t *testing.T) {
		code, out := runToExit(t, bin,
			"COMPASS_RUNNER_TOKEN_FILE="+path,
			"COMPASS_RUNNER_TOKEN=minted-secret",
			"COMPASS_SERVER="+s.doorURL,
			"COMPASS_HEALTH_ADDR="+testutil.FreeAddr(t),
		)
		if code != 2 || !strings.Contains(out, runner.ErrBothTokens.Error()) || strings.Contains(out, "minted-secret") || strings.Contains(out, token) {
			t.Fatalf("exit %d, stderr %q; want exit 2 with %q and no token", code, out, runner.ErrBothTokens)
		}
	})

	t.Run("two token file variables", func(t *testing.T) {
		code, out := runToExit(t, bin,
			"COMPASS_RUNNER_TOKEN_FILE="+path,
			"COMPASS_TOKEN_FILE="+path+".old",
			"COMPASS_SERVER="+s.doorURL,
			"COMPASS_HEALTH_ADDR="+testutil.FreeAddr(t),
		)
		if code != 2 || !strings.Contains(out, "COMPASS_RUNNER_TOKEN_FILE and COMPASS_TOKEN_FILE") || strings.Contains(out, token) {
			t.Fatalf("exit %d, stderr %q; want exit 2 naming both variables and no token", code, out)
		}
	})
}
