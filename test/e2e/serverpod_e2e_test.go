package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// The operator procedures that docs/self-host.md and docs/store.md run
// inside the Server's pod with kubectl exec, run here with the real
// compass-server binary: the command is the documented line's part after
// "--", its environment the rendered Server container's (every path under a
// temporary root, as if it were the pod's filesystem), its stdout the file
// the line redirects to. kubectl exec gives the command the container's
// environment and filesystem and, without -t, passes stdout through byte
// for byte; those are the parts of it the procedures rely on.

// podExecLine matches a documented kubectl exec into the Server's
// container: the compass-server arguments and the file stdout goes to.
var podExecLine = regexp.MustCompile(`(?m)^kubectl -n \$NS exec statefulset/compass-server -c server -- compass-server (\S+[^>\n]*?) > (\S+)$`)

// documentedExec returns the arguments and the output file of the first
// line of doc (a path from the repository's root) that runs compass-server
// command in the Server's pod.
func documentedExec(t *testing.T, doc, command string) (args []string, out string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", doc))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range podExecLine.FindAllStringSubmatch(string(b), -1) {
		if f := strings.Fields(m[1]); f[0] == command {
			return f, m[2]
		}
	}
	t.Fatalf("%s has no kubectl exec line running compass-server %s in the Server's pod", doc, command)
	return nil, ""
}

// serverPod is the rendered SQLite Server's pod, on this machine: its
// container's environment with every path under root.
type serverPod struct {
	root string
	env  []string // the serve container's variables, paths rebased
}

// renderServerPod renders the manifests with the Server on SQLite and
// returns its serve container's environment, every absolute path moved
// under a new temporary root. A variable the pod takes from a source
// (COMPASS_POD_IP) is left out, and one that expands it is kept as written:
// neither is read by an operator command.
func renderServerPod(t *testing.T) serverPod {
	t.Helper()
	p := deploy.DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	pod := serverPod{root: t.TempDir()}
	for _, c := range deploytest.RenderedPod(t, p, "StatefulSet", deploy.ServerName).Containers {
		if c.Name != "server" {
			continue
		}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom != nil:
			case strings.HasPrefix(e.Value, "/"):
				pod.env = append(pod.env, e.Name+"="+filepath.Join(pod.root, e.Value))
			default:
				pod.env = append(pod.env, e.Name+"="+e.Value)
			}
		}
		return pod
	}
	t.Fatalf("StatefulSet %s has no container named server", deploy.ServerName)
	return serverPod{}
}

// get is the pod's value of variable name; the test fails without it.
func (p serverPod) get(t *testing.T, name string) string {
	t.Helper()
	for _, kv := range p.env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	t.Fatalf("the Server's container sets no %s", name)
	return ""
}

// serve starts compass-server serve as the pod runs it, on a free port with
// a certificate for loopback, and without NATS and the cluster file, which
// the procedures do not touch; it returns the door's URL, its CA file and
// the process.
func (p serverPod) serve(t *testing.T, bin string) (doorURL, caFile string, proc *daemonProc) {
	t.Helper()
	tlsDir := filepath.Dir(p.get(t, "COMPASS_TLS_CERT"))
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile := servertest.TLS(t, tlsDir)
	if certFile != p.get(t, "COMPASS_TLS_CERT") || keyFile != p.get(t, "COMPASS_TLS_KEY") {
		t.Fatalf("the pod's certificate is at %s and %s, not %s and %s", p.get(t, "COMPASS_TLS_CERT"), p.get(t, "COMPASS_TLS_KEY"), certFile, keyFile)
	}
	addr := testutil.FreeAddr(t)
	env := append(p.serveEnv(), "COMPASS_LISTEN="+addr, "COMPASS_METRICS_ADDR=", "COMPASS_LOG_FORMAT=text")
	proc = startProc(t, filepath.Join(bin, "compass-server"), []string{"serve"}, env...)
	proc.waitLog(t, "door listening", 1)
	return "https://" + addr, caFile, proc
}

// command is compass-server with args as a container of the pod runs it:
// env (NAME=value; an absolute path in a value moved under the pod's root,
// as the pod's own are) and nothing of the test's own COMPASS_* variables.
func (p serverPod) command(ctx context.Context, bin string, args, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "compass-server"), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COMPASS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, kv := range env {
		if name, v, _ := strings.Cut(kv, "="); strings.HasPrefix(v, "/") && !strings.HasPrefix(v, p.root) {
			kv = name + "=" + filepath.Join(p.root, v)
		}
		cmd.Env = append(cmd.Env, kv)
	}
	return cmd
}

// serveEnv is the pod's environment for serve without NATS, the cluster
// file, the metrics and the door's address, which the procedures do not
// touch and the caller sets.
func (p serverPod) serveEnv() []string {
	var env []string
	for _, kv := range p.env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "COMPASS_NATS_") || name == "COMPASS_RUNNER_CLUSTERS" || name == "COMPASS_METRICS_ADDR" || name == "COMPASS_LISTEN" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// exec runs compass-server with args as kubectl exec runs it in the pod:
// the container's environment and nothing of the test's own COMPASS_*
// variables; stdout goes to the file out, created 0600 as a shell's
// redirection would (under the umask). It returns the exit code and stderr.
func (p serverPod) exec(t *testing.T, bin string, args []string, out string, stdout *os.File) (int, string) {
	t.Helper()
	cmd := p.command(t.Context(), bin, args, p.env)
	if stdout == nil {
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		stdout = f
	}
	cmd.Stdout = stdout
	return exitOf(t, cmd)
}

// mintAccount runs mint-account-token --name name in the pod, the token to
// dir/<name>.token, and returns that file and the command's stderr (which
// names the token's public ID).
func (p serverPod) mintAccount(t *testing.T, bin, dir, name string) (file, stderr string) {
	t.Helper()
	file = filepath.Join(dir, name+".token")
	code, stderr := p.exec(t, bin, []string{"mint-account-token", "--name", name}, file, nil)
	if code != 0 {
		t.Fatalf("mint %s: exit %d, %s", name, code, stderr)
	}
	return file, stderr
}

// stop ends serve with SIGTERM and waits for its exit 0.
func stop(t *testing.T, p *daemonProc) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v\n%s", err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve: no exit 30 s after SIGTERM:\n%s", p.stderr)
	}
}

// docs/self-host.md, "The first account token": minted in the Server's pod
// beside the running Server, it opens that Server's admin door.
func TestFirstAccountTokenThroughTheServerPod(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server")
	pod := renderServerPod(t)
	doorURL, caFile, srv := pod.serve(t, bin)
	args, out := documentedExec(t, "docs/self-host.md", "mint-account-token")
	tokenFile := filepath.Join(t.TempDir(), out)

	code, stderr := pod.exec(t, bin, args, tokenFile, nil)
	if code != 0 || !regexp.MustCompile(`^minted account token [0-9a-f]{16} for "ops"; it does not expire;`).MatchString(stderr) {
		t.Fatalf("compass-server %v in the pod: exit %d, stderr %q", args, code, stderr)
	}
	tok := testutil.ReadTrim(t, tokenFile)
	if strings.Contains(stderr, tok) || strings.Contains(srv.stderr.String(), tok) {
		t.Fatal("the token appears on stderr or in the Server's log")
	}

	// The documented use, from outside the pod: the token opens the door.
	cmd := exec.Command(filepath.Join(bin, "compass-server"), "runners", "--server", doorURL, "--ca-file", caFile, "--token-file", tokenFile, "--output", "json")
	var stdout, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("runners --server with the first account token: %v\n%s", err, errOut.String())
	}
	var list struct {
		Runners []map[string]any `json:"runners"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &list); err != nil || list.Runners == nil || len(list.Runners) != 0 {
		t.Fatalf("runners --output json through the door: %v\n%s", err, stdout.String())
	}
	// The token is the account's, in the Server's own database, as
	// list-tokens run the same way shows.
	listFile := filepath.Join(t.TempDir(), "tokens.json")
	code, stderr = pod.exec(t, bin, []string{"list-tokens", "--output", "json"}, listFile, nil)
	if code != 0 {
		t.Fatalf("list-tokens in the pod: exit %d, %s", code, stderr)
	}
	var tokens struct {
		Tokens []struct {
			Kind    string `json:"kind"`
			Subject string `json:"subject"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(testutil.ReadTrim(t, listFile)), &tokens); err != nil || len(tokens.Tokens) != 1 ||
		tokens.Tokens[0].Kind != "account" || tokens.Tokens[0].Subject != "ops" {
		t.Fatalf("list-tokens --output json in the pod: %+v, %v", tokens, err)
	}
	stop(t, srv)
}

// docs/store.md, "SQLite in a cluster": the backup streamed out of the pod
// while serve runs is the database as it was: it holds the tokens minted
// before the backup and not the one minted after. Put in place by hand, it
// is refused by serve. A terminal as stdout is refused.
func TestBackupThroughTheServerPod(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server")
	pod := renderServerPod(t)
	_, _, srv := pod.serve(t, bin)
	tmp := t.TempDir()
	mint := func(name string) string {
		t.Helper()
		f, _ := pod.mintAccount(t, bin, tmp, name)
		return f
	}
	before := mint("ops")

	args, out := documentedExec(t, "docs/store.md", "backup")
	backup := filepath.Join(tmp, out)
	code, stderr := pod.exec(t, bin, args, backup, nil)
	dataDir := pod.get(t, "COMPASS_DATA_DIR")
	if want := "backed up the SQLite database " + filepath.Join(dataDir, "compass.db") + " (schema version "; code != 0 || !strings.HasPrefix(stderr, want) || !strings.HasSuffix(stderr, ") to stdout\n") {
		t.Fatalf("compass-server %v in the pod: exit %d, stderr %q", args, code, stderr)
	}
	after := mint("late")

	// The copy, as the documented check opens it.
	cp, err := store.OpenCurrent(t.Context(), "sqlite://"+backup)
	if err != nil {
		t.Fatalf("the streamed copy: %v", err)
	}
	for f, want := range map[string]bool{before: true, after: false} {
		_, err := verifier.NewResolver(nil, cp).Resolve(t.Context(), testutil.ReadTrim(t, f), verifier.SubjectAccount)
		if (err == nil) != want {
			t.Fatalf("%s in the copy: %v, want found %v", filepath.Base(f), err, want)
		}
	}
	_ = cp.Close()
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".compass-backup-") {
			t.Fatalf("the backup left %s in the data directory", e.Name())
		}
	}

	// A terminal as stdout (kubectl exec -t): refused before anything is read.
	code, stderr = pod.exec(t, bin, args, "", testutil.PTY(t))
	if code != 2 || stderr != "compass-server: --to -: stdout is a terminal: redirect it to a file (compass-server backup --to - > compass.db; with kubectl exec, leave out -t)\n" {
		t.Fatalf("backup --to - onto a terminal: exit %d, stderr %q", code, stderr)
	}

	// The copy put in place by hand, as the restore before the restore guard
	// did (the Server stopped, the file replaced, -wal and -shm removed):
	// serve refuses it and says what to run, since a token revoked after the
	// backup would be live again. TestRestoreThroughTheServerPod runs the
	// documented restore.
	stop(t, srv)
	data, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dataDir, "compass.db")
	if err := os.WriteFile(db+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(db+".new", db); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Remove(db + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if stderr := pod.serveRefused(t, bin); !strings.Contains(stderr, "is a backup taken at") || !strings.Contains(stderr, "compass-server restore") {
		t.Fatalf("serve on a backup put in place by hand: %s", stderr)
	}
}
