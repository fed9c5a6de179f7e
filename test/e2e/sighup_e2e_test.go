package e2e

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/loopbackca"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// daemonProc is a daemon binary running as a child process.
type daemonProc struct {
	name   string
	cmd    *exec.Cmd
	stderr *testlog.Buffer
	exited chan error
}

func startProc(t *testing.T, bin string, args []string, env ...string) *daemonProc {
	t.Helper()
	p := &daemonProc{name: filepath.Base(bin), cmd: exec.Command(bin, args...), stderr: &testlog.Buffer{}, exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// waitLog waits until the process has logged msg n times; it fails at once
// if the process exits.
func (p *daemonProc) waitLog(t *testing.T, msg string, n int) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for strings.Count(p.stderr.String(), msg) < n {
		select {
		case err := <-p.exited:
			p.exited <- err // for the cleanup
			t.Fatalf("%s exited (%v) waiting for %q:\n%s", p.name, err, msg, p.stderr)
		case <-deadline:
			t.Fatalf("%s: %q logged %d times, want %d:\n%s", p.name, msg, strings.Count(p.stderr.String(), msg), n, p.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *daemonProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
}

// TestDaemonBinariesReloadOnSIGHUP runs the compass-server and
// compass-callout binaries over one cluster file, and compass-runner: SIGHUP
// never stops any of them. The two that hold the cluster file reload it on
// SIGHUP (a refused file included) and keep running; the Runner ignores it.
// SIGTERM still ends each with exit 0.
func TestDaemonBinariesReloadOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server", "compass-callout", "compass-runner")
	dir := t.TempDir()
	is := testkeys.Issuer(t)
	clusters := filepath.Join(dir, "clusters.yaml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(clusters+".new", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(clusters+".new", clusters); err != nil {
			t.Fatal(err)
		}
	}
	good := "clusters:\n" + verifiertest.ClusterEntry(t, is, dir, "prod")
	write(good)

	// compass-server serve, with a certificate of its own.
	cert, _, err := loopbackca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startProc(t, filepath.Join(bin, "compass-server"), []string{"serve"},
		"COMPASS_LISTEN="+testutil.FreeAddr(t), "COMPASS_TLS_CERT="+certFile, "COMPASS_TLS_KEY="+keyFile,
		"COMPASS_RUNNER_CLUSTERS="+clusters, "COMPASS_DATA_DIR="+filepath.Join(dir, "server"), "COMPASS_LOG_FORMAT=text")

	// compass-callout, on an embedded nats-server in server-config mode.
	ns := natsembed.ServeForProcess(t, dir)
	co := startProc(t, filepath.Join(bin, "compass-callout"), nil, append(ns.Env(),
		"COMPASS_RUNNER_CLUSTERS="+clusters,
		"COMPASS_METRICS_ADDR="+testutil.FreeAddr(t), "COMPASS_LOG_FORMAT=text")...)

	// compass-runner, pointed at a door that is not there: it keeps retrying.
	tokenFile := filepath.Join(dir, "token")
	if _, err := is.WriteTokenFile(tokenFile, kubeissuer.Pod{NodeName: "n"}, 0); err != nil {
		t.Fatal(err)
	}
	rn := startProc(t, filepath.Join(bin, "compass-runner"), nil,
		"COMPASS_TOKEN_FILE="+tokenFile, "COMPASS_SERVER=https://"+testutil.FreeAddr(t), "COMPASS_HEALTH_ADDR="+testutil.FreeAddr(t),
		"COMPASS_LOG_FORMAT=text")

	srv.waitLog(t, "door listening", 1)
	co.waitLog(t, "compass-callout answering", 1)
	rn.waitLog(t, "msg=", 1)

	const (
		hup     = "clusterfile: SIGHUP: reloading the cluster file"
		applied = "clusterfile: cluster file applied"
		refused = "clusterfile: new cluster file refused; the clusters in force stay in force"
	)
	// A SIGHUP with the file unchanged, one with a refused file, one with a
	// good new file.
	for _, p := range []*daemonProc{srv, co} {
		p.signal(t, syscall.SIGHUP)
		p.waitLog(t, hup, 1)
	}
	write("clusters: [")
	for _, p := range []*daemonProc{srv, co} {
		p.signal(t, syscall.SIGHUP)
		p.waitLog(t, refused, 1)
	}
	write(good + "    deny: { nodes: [n] }\n")
	for _, p := range []*daemonProc{srv, co} {
		p.signal(t, syscall.SIGHUP)
		p.waitLog(t, applied, 1)
	}
	rn.signal(t, syscall.SIGHUP)
	rn.signal(t, syscall.SIGHUP)

	for _, p := range []*daemonProc{srv, co, rn} {
		p.signal(t, syscall.SIGTERM)
		select {
		case err := <-p.exited:
			if err != nil {
				t.Fatalf("%s after SIGHUPs and SIGTERM: %v\n%s", p.name, err, p.stderr)
			}
			p.exited <- nil // for the cleanup
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no exit 30 s after SIGTERM:\n%s", p.name, p.stderr)
		}
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rn.stderr.String(), strings.TrimSpace(string(tok))) {
		t.Fatal("the token appears in the Runner's log")
	}
}
