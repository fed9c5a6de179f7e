package natsembed

// The real nats-server binary, for the tests and the harness that must see
// what users run: options no configuration file can set (the short first
// PING, for one) behave as they do in production only there.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testlog"
)

// BinaryEnv names the pinned nats-server binary; .ci/test sets it to the one
// .ci/tools.sh installs.
const BinaryEnv = "COMPASS_TEST_NATS_SERVER"

// processStartTimeout bounds a nats-server start on a loaded two-core
// machine; it takes tens of milliseconds when idle.
const processStartTimeout = 15 * time.Second

// Binary is the path of the real nats-server, or the end of the test: it
// fails under CI (where the binary must be there) and skips otherwise.
func Binary(t testing.TB) string {
	t.Helper()
	path := os.Getenv(BinaryEnv)
	msg := ""
	if path == "" {
		msg = BinaryEnv + " is not set (.ci/test sets it to the nats-server .ci/tools.sh installs)"
	} else if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		msg = fmt.Sprintf("%s=%s is not a nats-server binary", BinaryEnv, path)
	}
	if msg != "" {
		if os.Getenv("CI") != "" {
			t.Fatal("natsembed: " + msg)
		}
		t.Skip("natsembed: " + msg + "; skipped because CI is unset")
	}
	return path
}

// Process is a real nats-server running as a subprocess of the test. Its
// addresses are read from its own log, so a configuration may listen on
// port -1 (any free port) for clients, routes and monitoring alike.
type Process struct {
	URL        string // client URL, nats://host:port
	ClusterURL string // route URL, nats://host:port, when the configuration has a cluster block
	MonitorURL string // http://host:port, when it has an http listener

	cmd     *exec.Cmd
	logs    *testlog.Buffer
	scanned chan struct{}
	once    sync.Once
}

var (
	clientLine  = regexp.MustCompile(`Listening for client connections on (\S+:\d+)`)
	routeLine   = regexp.MustCompile(`Listening for route connections on (\S+:\d+)`)
	monitorLine = regexp.MustCompile(`Starting http monitor on (\S+:\d+)`)
)

// StartProcess runs the real nats-server on conf and returns once it is
// ready for connections. It is killed when the test ends (and, on Linux,
// with the test binary, so a test that panics leaves no server behind); its
// log goes to the test log only when the test failed.
func StartProcess(t testing.TB, conf string) *Process {
	t.Helper()
	bin := Binary(t)
	path := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &Process{cmd: exec.Command(bin, "-c", path), logs: &testlog.Buffer{}, scanned: make(chan struct{})}
	p.cmd.SysProcAttr = childAttr()
	p.cmd.Stdout = p.logs
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("natsembed: start %s: %v", bin, err)
	}
	// The scanner ends when the process does (its end of the pipe closes).
	ready := make(chan struct{})
	var mu sync.Mutex
	go func() {
		defer close(p.scanned)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(p.logs, line)
			mu.Lock()
			for _, m := range []struct {
				re  *regexp.Regexp
				url *string
				sch string
			}{{clientLine, &p.URL, "nats://"}, {routeLine, &p.ClusterURL, "nats://"}, {monitorLine, &p.MonitorURL, "http://"}} {
				if s := m.re.FindStringSubmatch(line); s != nil && *m.url == "" {
					*m.url = m.sch + s[1]
				}
			}
			mu.Unlock()
			if strings.Contains(line, "Server is ready") {
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", p.logs.String())
		}
	})
	select {
	case <-ready:
	case <-p.scanned:
		t.Fatalf("natsembed: nats-server exited before it was ready:\n%s", p.logs.String())
	case <-time.After(processStartTimeout):
		t.Fatalf("natsembed: nats-server not ready within %v:\n%s", processStartTimeout, p.logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if p.URL == "" {
		t.Fatalf("natsembed: nats-server is ready but logged no client listener:\n%s", p.logs.String())
	}
	return p
}

// Kill ends the server at once (SIGKILL: a node lost, not one shut down) and
// waits for it. Calling it again does nothing.
func (p *Process) Kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.scanned
		_ = p.cmd.Wait()
	})
}

// PID is the server's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Log is what the server has logged so far.
func (p *Process) Log() string { return p.logs.String() }
