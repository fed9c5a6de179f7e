package commands_test

import (
	"errors"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/doorhttp"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/devstack"
)

// fileState is a file's bytes and modification time.
type fileState struct {
	data  string
	mtime time.Time
}

// snapshot records every file in dir (recursively) with its bytes and mtime.
func snapshot(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out[path] = fileState{string(b), fi.ModTime()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// occupy listens on a random loopback port until the test ends.
func occupy(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

// A second dev fails at once, naming the taken port, before it touches the
// data dir: the first one's CA, tokens and database keep their bytes and
// modification times.
func TestDevRefusesTakenPortsBeforeTouchingData(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, name := range []string{devstack.CAFile, devstack.AdminTokenFile, devstack.RunnerTokenFile, "dev-issuer-ca.pem", "compass.db"} {
		p := filepath.Join(dir, name)
		writeFile(t, p, "the first dev's "+name+"\n")
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, dir)
	door, nats := occupy(t), occupy(t)

	for _, tc := range []struct {
		name, listen, natsListen, want string
	}{
		{"door", door, "127.0.0.1:0",
			"server: dev: the door's address " + door + " (--listen) is taken: another compass-server dev may be running; stop it or move this one with --listen; its --data-dir may stay, as no other dev holds it (nothing in " + dir + " was changed)"},
		{"nats", "127.0.0.1:0", nats,
			"server: dev: the NATS address " + nats + " (--nats-listen) is taken: another compass-server dev may be running; stop it or move this one with --nats-listen; its --data-dir may stay, as no other dev holds it (nothing in " + dir + " was changed)"},
		{"both", door, nats,
			"server: dev: the door's address " + door + " (--listen) and the NATS address " + nats + " (--nats-listen) are taken: another compass-server dev may be running; stop it or move this one with --listen and --nats-listen; its --data-dir may stay, as no other dev holds it (nothing in " + dir + " was changed)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready := false
			err := devstack.Run(t.Context(), devstack.Config{DataDir: dir, Listen: tc.listen, NATSListen: tc.natsListen,
				Ready: func(devstack.Info) { ready = true }})
			if err == nil || err.Error() != tc.want || ready {
				t.Fatalf("Dev with a taken port = %v (ready %v), want %q", err, ready, tc.want)
			}
			// Through the command line too, with the exit code.
			code, stdout, stderr := runServer(t, nil, "dev", "--data-dir", dir, "--listen", tc.listen, "--nats-listen", tc.natsListen)
			if code != 1 || stdout != "" || !strings.HasSuffix(stderr, "compass-server: "+tc.want+"\n") {
				t.Fatalf("compass-server dev: code %d, stdout %q, stderr %q; want it to end %q", code, stdout, stderr, tc.want)
			}
			if after := snapshot(t, dir); !maps.Equal(before, after) {
				t.Fatalf("dev touched %s:\nbefore %v\nafter  %v", dir, before, after)
			}
		})
	}
	// A data dir that does not exist yet is not created either.
	missing := filepath.Join(t.TempDir(), "never")
	if err := devstack.Run(t.Context(), devstack.Config{DataDir: missing, Listen: door, NATSListen: "127.0.0.1:0"}); err == nil {
		t.Fatal("Dev with a taken door port succeeded")
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused dev created its data dir: %v", err)
	}
}

// dev run twice on the same ports and data dir: the second fails at once,
// naming every flag it must change (--data-dir too: following advice that
// named only the ports would rewrite the first one's CA and tokens), and the
// first one's CA file is neither rewritten nor touched, so the Runner and
// CLI trusting it keep working.
func TestDevTwice(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".data")
	door, natsAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	info := startDev(t, dir, door, natsAddr)
	caBefore := snapshot(t, dir)[info.CAFile]
	code, _, stderr := runServer(t, nil, "dev", "--data-dir", dir, "--listen", door, "--nats-listen", natsAddr)
	want := "compass-server: server: dev: the door's address " + door + " (--listen) and the NATS address " + natsAddr +
		" (--nats-listen) are taken and the data dir " + dir + " (--data-dir) is in use by another compass-server dev (pid " + strconv.Itoa(os.Getpid()) +
		"): stop it or give this one its own --listen, --nats-listen and --data-dir (nothing in " + dir + " was changed)\n"
	if code != 1 || !strings.HasSuffix(stderr, want) {
		t.Fatalf("second dev: code %d, stderr %q; want it to end %q", code, stderr, want)
	}
	if caAfter := snapshot(t, dir)[info.CAFile]; caAfter != caBefore || caBefore.data == "" {
		t.Fatal("the second dev rewrote the first one's CA file")
	}
	// The first one still serves with that CA.
	hc, err := doorhttp.Client(info.DoorURL, info.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	res, err := hc.Get(info.DoorURL + "/")
	if err != nil {
		t.Fatalf("the first dev's door with its CA after the second dev failed: %v", err)
	}
	_ = res.Body.Close()
}
