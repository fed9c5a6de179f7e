package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testlog"
)

// devWait bounds each wait on the dev stack's processes: building and
// starting take seconds; enrollment and the first NATS connect are fast.
const devWait = 90 * time.Second

// buildBinary builds pkg into dir/name; ldflags, when given, are passed to
// the linker (a release's -X version stamp, say).
func buildBinary(t *testing.T, dir, pkg, name string, ldflags ...string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if len(ldflags) > 0 {
		args = append(args, "-ldflags", strings.Join(ldflags, " "))
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, pkg)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// cleanEnv is the test's environment without COMPASS_* variables, so only
// what a test sets reaches the binaries.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COMPASS_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// stop sends SIGTERM and waits for a clean exit.
func stop(t *testing.T, name string, cmd *exec.Cmd, done <-chan error, logs *testlog.Buffer) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal %s: %v", name, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s exited with %v after SIGTERM; log:\n%s", name, err, logs.String())
		}
	case <-time.After(devWait):
		_ = cmd.Process.Kill()
		t.Fatalf("%s did not stop after SIGTERM", name)
	}
}

// The README's quickstart: "compass-server dev" starts the whole stack and
// prints a compass-runner command and a ping-runner command; a Runner started
// with exactly the printed command enrolls with the dev issuer's projected
// token (as dev/dev-node) and connects to NATS through the callout, and the
// printed ping-runner command gets its answer.
func TestDevCommandPingsRunnerStartedWithPrintedCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs both binaries")
	}
	bin := t.TempDir()
	// Linked with a version as .ci/images links a release's: Enroll must tell
	// the Runner that version (server_version), never a placeholder.
	const linked = "v0.0.0-e2e.1"
	serverBin := buildBinary(t, bin, "github.com/compass-runner/identity/cmd/compass-server", "compass-server",
		"-X github.com/compass-runner/identity/internal/lib/buildinfo.version="+linked)
	runnerBin := buildBinary(t, bin, "github.com/compass-runner/identity/cmd/compass-runner", "compass-runner")
	work := t.TempDir() // the clean clone's working directory; .data/ goes here

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Port 0 so parallel test runs never collide; the printed commands carry
	// the ports actually bound.
	dev := exec.CommandContext(ctx, serverBin, "dev", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0")
	dev.Dir, dev.Env = work, cleanEnv()
	devLog := &testlog.Buffer{}
	dev.Stderr = devLog
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	devDone := make(chan error, 1)
	printed := make(chan [2]string, 1)
	devOut := &testlog.Buffer{}
	go func() {
		var runnerCmd, pingCmd string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			_, _ = devOut.Write([]byte(line + "\n"))
			switch {
			case strings.HasPrefix(line, "compass-runner "):
				runnerCmd = line
			case strings.HasPrefix(line, "compass-server ping-runner "):
				pingCmd = line
				printed <- [2]string{runnerCmd, pingCmd}
			}
		}
		devDone <- dev.Wait()
	}()
	var cmds [2]string
	select {
	case cmds = <-printed:
	case err := <-devDone:
		t.Fatalf("compass-server dev exited: %v\nstdout:\n%s\nstderr:\n%s", err, devOut.String(), devLog.String())
	case <-time.After(devWait):
		t.Fatalf("compass-server dev printed no commands\nstdout:\n%s\nstderr:\n%s", devOut.String(), devLog.String())
	}
	if cmds[0] == "" {
		t.Fatalf("no compass-runner command was printed:\n%s", devOut.String())
	}

	// The Runner, exactly as printed (its health port moved off the default
	// through the environment, so parallel runs do not collide).
	args := strings.Fields(cmds[0])
	runner := exec.CommandContext(ctx, runnerBin, args[1:]...)
	runner.Dir, runner.Env = work, cleanEnv("COMPASS_HEALTH_ADDR=127.0.0.1:0")
	runnerLog := &testlog.Buffer{}
	runner.Stdout, runner.Stderr = runnerLog, runnerLog
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	runnerDone := make(chan error, 1)
	go func() { runnerDone <- runner.Wait() }()

	// ping-runner, exactly as printed, until the Runner has enrolled and
	// connected (two separate processes: polling with a deadline).
	pargs := strings.Fields(cmds[1])
	var out []byte
	deadline := time.Now().Add(devWait)
	for {
		ping := exec.CommandContext(ctx, serverBin, pargs[1:]...)
		ping.Dir, ping.Env = work, cleanEnv()
		out, err = ping.CombinedOutput()
		if err == nil {
			break
		}
		select {
		case err := <-runnerDone:
			t.Fatalf("compass-runner exited: %v\n%s\ndev log:\n%s", err, runnerLog.String(), devLog.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ping-runner never succeeded; last:\n%s\nrunner log:\n%s\ndev log:\n%s", out, runnerLog.String(), devLog.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(string(out), `"ok":true`) || !strings.Contains(string(out), `dev/dev-node`) || !strings.Contains(string(out), "rtt: ") {
		t.Fatalf("ping-runner output:\n%s", out)
	}

	// The Runner was told the Server's linked version when it enrolled.
	if !strings.Contains(runnerLog.String(), `"server_version":"`+linked+`"`) {
		t.Fatalf("the Runner's enroll log does not carry server_version %q:\n%s", linked, runnerLog.String())
	}

	// The registry knows the Runner as a projected dev/dev-node.
	list := exec.CommandContext(ctx, serverBin, "runners", "--data-dir", ".data")
	list.Dir, list.Env = work, cleanEnv()
	lout, err := list.CombinedOutput()
	if err != nil || !strings.Contains(string(lout), "dev/dev-node") || !strings.Contains(string(lout), "projected") {
		t.Fatalf("runners: %v\n%s", err, lout)
	}

	// Neither process logged a token.
	for _, f := range []string{".data/runner-token", ".data/admin-token"} {
		tok, err := os.ReadFile(filepath.Join(work, f))
		if err != nil {
			t.Fatal(err)
		}
		secret := strings.TrimSpace(string(tok))
		if i := strings.LastIndexByte(secret, '.'); i >= 0 {
			secret = secret[i+1:] // a JWS's signature
		}
		for name, logs := range map[string]string{"dev": devLog.String() + devOut.String(), "runner": runnerLog.String()} {
			if strings.Contains(logs, secret) {
				t.Fatalf("the %s log contains %s", name, f)
			}
		}
	}

	stop(t, "compass-runner", runner, runnerDone, runnerLog)
	stop(t, "compass-server dev", dev, devDone, devLog)
}
