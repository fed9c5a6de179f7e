//go:build linux

package fleet

// The client processes: the test binary re-executed with childEnv naming a
// spec file. A child holds its share of the fleet's connections, so no
// process nears its open-file limit. It talks to the harness in lines:
//
//	child → harness (stdout): "ready", then "connected <ok> <retries> <failed>"
//	                           once every connection is up or given up, and
//	                           "lost <i>" for every connection the server
//	                           closed afterwards (a bystander kicked: a bug)
//	harness → child (stdin):  "go" starts the connect storm; EOF ends the
//	                           child, which closes its connections first.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testlog"
)

// childEnv names a child's spec file; set only in the children.
const childEnv = "COMPASS_FLEET_CHILD"

// connectAttempts bounds one connection's tries during the storm: a CONNECT
// that timed out at the server while the callouts were saturated is tried
// again, and counted.
const connectAttempts = 5

// spec is what a child holds. The file is 0600 in the test's temporary
// directory: it carries tokens.
type spec struct {
	Source      string     `json:"source"` // local IP to dial from (127.0.0.x)
	Concurrency int        `json:"concurrency"`
	Conns       []specConn `json:"conns"`
}

type specConn struct {
	Addr    string `json:"addr"`
	Token   string `json:"token"`
	Subject string `json:"subject"`
}

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(childMain(path))
	}
	os.Exit(m.Run())
}

// childMain is a child's whole life; its exit code is 0 unless it could not
// start.
func childMain(path string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "fleet child:", err)
		return 2
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fail(err)
	}
	var sp spec
	if err := json.Unmarshal(raw, &sp); err != nil {
		return fail(fmt.Errorf("spec: %w", err))
	}
	if err := raiseFileLimit(len(sp.Conns) + 64); err != nil {
		return fail(err)
	}
	var outMu sync.Mutex
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
	}
	in := bufio.NewScanner(os.Stdin)
	say("ready")
	if !in.Scan() || in.Text() != "go" {
		return 0 // the harness gave up before the storm
	}

	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sp.Source)}, Timeout: handshakeTimeout}
	conns := make([]*rawConn, len(sp.Conns))
	var (
		closing          atomic.Bool
		next             atomic.Int64
		retries, failed  atomic.Int64
		wg, serving      sync.WaitGroup
		errMu            sync.Mutex
		errsShown        int
		maxErrorsToPrint = 5
	)
	for range max(1, sp.Concurrency) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(sp.Conns); i = int(next.Add(1) - 1) {
				c := sp.Conns[i]
				var rc *rawConn
				var err error
				for a := range connectAttempts {
					if a > 0 {
						retries.Add(1)
						time.Sleep(time.Duration(a) * 200 * time.Millisecond) // back off, not a wait for an event
					}
					if rc, err = dialRunner(d, c.Addr, c.Token, c.Subject); err == nil {
						break
					}
				}
				if err != nil {
					failed.Add(1)
					errMu.Lock()
					if errsShown < maxErrorsToPrint {
						errsShown++
						fmt.Fprintf(os.Stderr, "fleet child: connection %d: %v\n", i, err)
					}
					errMu.Unlock()
					continue
				}
				conns[i] = rc
				serving.Go(func() {
					if err := rc.serve(); !closing.Load() && closedByServer(err) {
						say("lost %d", i)
					}
				})
			}
		})
	}
	wg.Wait()
	say("connected %d %d %d", int64(len(sp.Conns))-failed.Load(), retries.Load(), failed.Load())

	// Until the harness closes stdin (or dies: Pdeathsig).
	_, _ = io.Copy(io.Discard, os.Stdin)
	closing.Store(true)
	for _, rc := range conns {
		if rc != nil {
			rc.close()
		}
	}
	serving.Wait()
	return 0
}

// raiseFileLimit raises the soft open-file limit to the hard one and
// checks that need fits under it.
func raiseFileLimit(need int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("setrlimit: %w", err)
		}
	}
	if uint64(need) > lim.Cur {
		return fmt.Errorf("%d open files needed, the limit is %d", need, lim.Cur)
	}
	return nil
}

// child is the harness's handle on one client process.
type child struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	ready     chan struct{}
	connected chan [3]int // ok, retries, failed
	exited    chan struct{}
	lost      atomic.Int64
	stderr    *testlog.Buffer
}

// startChild starts a client process holding sp's connections; it ends
// when the test does.
func startChild(t *testing.T, dir string, idx int, sp spec) *child {
	t.Helper()
	raw, err := json.Marshal(sp)
	if err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("%s/child-%d.json", dir, idx)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ch := &child{
		cmd: exec.Command(exe), ready: make(chan struct{}), connected: make(chan [3]int, 1),
		exited: make(chan struct{}), stderr: &testlog.Buffer{},
	}
	ch.cmd.Env = append(os.Environ(), childEnv+"="+path)
	ch.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	ch.cmd.Stderr = ch.stderr
	if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := ch.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.cmd.Start(); err != nil {
		t.Fatalf("start client process %d: %v", idx, err)
	}
	// The reader ends when the child does (its end of the pipe closes).
	go func() {
		defer close(ch.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 1 && f[0] == "ready":
				close(ch.ready)
			case len(f) == 4 && f[0] == "connected":
				var r [3]int
				for j := range r {
					r[j], _ = strconv.Atoi(f[j+1])
				}
				ch.connected <- r
			case len(f) == 2 && f[0] == "lost":
				ch.lost.Add(1)
			}
		}
	}()
	t.Cleanup(func() {
		_ = ch.stdin.Close()
		select {
		case <-ch.exited:
		case <-time.After(waitTimeout):
			_ = ch.cmd.Process.Kill()
			<-ch.exited
		}
		_ = ch.cmd.Wait()
		if out := ch.stderr.String(); t.Failed() && strings.TrimSpace(out) != "" {
			t.Logf("client process %d stderr:\n%s", idx, out)
		}
	})
	select {
	case <-ch.ready:
	case <-ch.exited:
		t.Fatalf("client process %d exited before it was ready:\n%s", idx, ch.stderr.String())
	case <-time.After(waitTimeout):
		t.Fatalf("client process %d not ready within %s", idx, waitTimeout)
	}
	return ch
}
