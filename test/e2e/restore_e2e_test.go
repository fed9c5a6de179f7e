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
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testutil"
)

// restoreContainer is the container of docs/store.md's in-cluster restore
// pod: the compass-server arguments and environment it runs with.
type restoreContainer struct {
	Args []string `json:"args"`
	Env  []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
}

// documentedRestore reads the container of docs/store.md's kubectl run line
// that restores into the Server's claim: its "args" and "env".
func documentedRestore(t *testing.T) restoreContainer {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "store.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)kubectl -n \$NS run compass-restore .*?"containers": \[\{"name": "compass-restore",[^\n]*\n\s*("args": \[[^\]]*\]),\n\s*("env": \[[^\]]*\]),`).FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/store.md has no kubectl run compass-restore line with the container's args and env")
	}
	var c restoreContainer
	if err := json.Unmarshal([]byte("{"+string(m[1])+","+string(m[2])+"}"), &c); err != nil {
		t.Fatalf("the documented restore container: %v", err)
	}
	return c
}

// restoreIn runs the documented restore container's command with the pod's
// environment, its variables' paths under root as the pod's are, and stdin
// from the file in. It returns the exit code, stdout and stderr.
func (p serverPod) restoreIn(t *testing.T, bin string, c restoreContainer, in string) (int, string, string) {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	cmd := p.command(t.Context(), bin, c.Args, env)
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stdout bytes.Buffer
	cmd.Stdin, cmd.Stdout = f, &stdout
	code, stderr := exitOf(t, cmd)
	return code, stdout.String(), stderr
}

// serveRefused runs compass-server serve as the pod runs it and expects it
// to refuse to start: it returns serve's stderr. A serve that starts instead
// is killed after 30 s, and the test fails.
func (p serverPod) serveRefused(t *testing.T, bin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := p.command(ctx, bin, []string{"serve"}, append(p.serveEnv(), "COMPASS_LISTEN="+testutil.FreeAddr(t), "COMPASS_METRICS_ADDR="))
	code, stderr := exitOf(t, cmd)
	if code != 1 {
		t.Fatalf("serve: exit %d, want 1 (refused); stderr:\n%s", code, stderr)
	}
	return stderr
}

// doorAccepts reports whether the Server's door at doorURL accepts the
// account token in tokenFile (runners --server); a refusal must be
// unauthenticated.
func doorAccepts(t *testing.T, bin, doorURL, caFile, tokenFile string) bool {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "compass-server"), "runners", "--server", doorURL, "--ca-file", caFile, "--token-file", tokenFile)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &exit) && exit.ExitCode() == 1 && strings.Contains(errOut.String(), "unauthenticated"):
		return false
	}
	t.Fatalf("runners --server with %s: %v; %s", filepath.Base(tokenFile), err, errOut.String())
	return false
}

// docs/store.md, "SQLite in a cluster": the restore as documented. A token
// is revoked and another minted after the backup; the Server stopped, the
// documented restore container's command runs with the backup on its stdin;
// the Server started on the result refuses the revoked token and the one
// minted after the backup at its door, and accepts the one kept. The
// restore's output names both by public ID, and no token appears in it.
func TestRestoreThroughTheServerPod(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t, "compass-server")
	pod := renderServerPod(t)
	_, _, srv := pod.serve(t, bin)
	tmp := t.TempDir()
	idRE := regexp.MustCompile(`token ([0-9a-f]{16}) for`)
	mint := func(name string) (file, id string) {
		t.Helper()
		file, stderr := pod.mintAccount(t, bin, tmp, name)
		m := idRE.FindStringSubmatch(stderr)
		if m == nil {
			t.Fatalf("mint %s printed no token ID: %s", name, stderr)
		}
		return file, m[1]
	}
	kept, _ := mint("ops")
	leaked, leakedID := mint("leaked")

	args, out := documentedExec(t, "docs/store.md", "backup")
	backup := filepath.Join(tmp, out)
	if code, stderr := pod.exec(t, bin, args, backup, nil); code != 0 {
		t.Fatalf("compass-server %v in the pod: exit %d, %s", args, code, stderr)
	}
	if code, stderr := pod.exec(t, bin, []string{"revoke-token", leakedID}, filepath.Join(tmp, "revoke.out"), nil); code != 0 {
		t.Fatalf("revoke-token %s: exit %d, %s", leakedID, code, stderr)
	}
	late, lateID := mint("late")
	stop(t, srv)

	c := documentedRestore(t)
	if dataDir := pod.get(t, "COMPASS_DATA_DIR"); len(c.Env) != 1 || c.Env[0].Name != "COMPASS_DATA_DIR" || filepath.Join(pod.root, c.Env[0].Value) != dataDir {
		t.Fatalf("the documented restore container's env %+v does not name the Server's data dir %s", c.Env, dataDir)
	}
	// A terminal as stdin (kubectl run -t, or no redirection): refused at
	// once, nothing read and nothing changed.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tty := exec.CommandContext(ctx, filepath.Join(bin, "compass-server"), c.Args...)
	tty.Env = append(os.Environ(), "COMPASS_DATA_DIR="+pod.get(t, "COMPASS_DATA_DIR"))
	tty.Stdin = testutil.PTY(t)
	if code, stderr := exitOf(t, tty); code != 1 || !strings.Contains(stderr, "--from -: stdin is a terminal") {
		t.Fatalf("restore --from - with a terminal as stdin: exit %d, %q", code, stderr)
	}

	code, stdout, stderr := pod.restoreIn(t, bin, c, backup)
	if code != 0 {
		t.Fatalf("compass-server %v with the backup on stdin: exit %d, %s", c.Args, code, stderr)
	}
	for _, want := range []string{"re-applied 1 revocations made after the backup", leakedID, "1 tokens minted after the backup are lost", lateID} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("restore's output lacks %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{kept, leaked, late} {
		if tok := testutil.ReadTrim(t, f); strings.Contains(stdout+stderr, tok) {
			t.Fatal("restore printed a token")
		}
	}

	doorURL, caFile, restored := pod.serve(t, bin)
	for _, tc := range []struct {
		name, file string
		want       bool
	}{
		{"the token kept", kept, true},
		{"the token revoked after the backup", leaked, false},
		{"the token minted after the backup", late, false},
	} {
		if got := doorAccepts(t, bin, doorURL, caFile, tc.file); got != tc.want {
			t.Errorf("%s: the door accepts it %v, want %v", tc.name, got, tc.want)
		}
	}
	stop(t, restored)
}
