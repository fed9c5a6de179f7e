package commands_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/devstack"
)

// startDev runs a dev in dir on the given ports until the test ends and
// returns once it is up.
func startDev(t *testing.T, dir, door, natsAddr string) devstack.Info {
	t.Helper()
	ready := make(chan devstack.Info, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- devstack.Run(ctx, devstack.Config{DataDir: dir, Listen: door, NATSListen: natsAddr,
			Ready: func(i devstack.Info) { ready <- i }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev in %s stopped with %v", dir, err)
		}
	})
	select {
	case info := <-ready:
		return info
	case err := <-done:
		done <- nil
		t.Fatalf("dev in %s: %v", dir, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("dev in %s did not become ready", dir)
	}
	return devstack.Info{}
}

// runningDevFiles is files, the snapshot of dir, without the database files
// when dir is running, the data dir of the dev that runs: that dev writes
// its own SQLite database (its WAL, its checkpoints) whenever it likes, so
// their bytes say nothing of a second dev. Every other file there (the
// lock, the CA, the tokens) changes only if the second one wrote it.
func runningDevFiles(dir, running string, files map[string]fileState) map[string]fileState {
	if dir != running {
		return files
	}
	out := maps.Clone(files)
	for _, name := range []string{"compass.db", "compass.db-wal", "compass.db-shm"} {
		delete(out, filepath.Join(dir, name))
	}
	return out
}

// A second dev is refused before it writes anything whichever way it
// collides with the first: the same ports with a data dir of its own (new
// or already holding files), or the same data dir on ports of its own. Each
// refusal names exactly the flags that must change; the first dev's files
// and the second one's data dir keep their bytes and modification times,
// and a data dir that did not exist is not created.
func TestDevSecondInstanceIsRefusedBeforeWritingAnything(t *testing.T) {
	first := filepath.Join(t.TempDir(), ".data")
	door, natsAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	startDev(t, first, door, natsAddr)
	pid := strconv.Itoa(os.Getpid())
	if _, ok := snapshot(t, first)[filepath.Join(first, devstack.LockFile)]; !ok {
		t.Fatalf("the running dev holds no %s in its data dir", devstack.LockFile)
	}

	// A data dir of its own that holds an earlier dev's files, not running.
	used := filepath.Join(t.TempDir(), "used")
	if err := os.MkdirAll(used, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{devstack.CAFile, devstack.RunnerTokenFile, devstack.LockFile} {
		writeFile(t, filepath.Join(used, name), "an earlier dev's "+name+"\n")
	}
	otherDoor, otherNATS := testutil.FreeAddr(t), testutil.FreeAddr(t)
	for _, tc := range []struct {
		name, dir, listen, natsListen, want string
	}{
		{"same ports, a new data dir", filepath.Join(t.TempDir(), "new"), door, natsAddr,
			"the door's address " + door + " (--listen) and the NATS address " + natsAddr + " (--nats-listen) are taken: another compass-server dev may be running; stop it or move this one with --listen and --nats-listen; its --data-dir may stay, as no other dev holds it"},
		{"same ports, a used data dir", used, door, natsAddr,
			"the door's address " + door + " (--listen) and the NATS address " + natsAddr + " (--nats-listen) are taken: another compass-server dev may be running; stop it or move this one with --listen and --nats-listen; its --data-dir may stay, as no other dev holds it"},
		{"same data dir, other ports", first, otherDoor, otherNATS,
			"the data dir " + first + " (--data-dir) is in use by another compass-server dev (pid " + pid + "): stop it or give this one its own --data-dir"},
		{"same data dir, random ports", first, "127.0.0.1:0", "127.0.0.1:0",
			"the data dir " + first + " (--data-dir) is in use by another compass-server dev (pid " + pid + "): stop it or give this one its own --data-dir"},
		{"same data dir, same door", first, door, otherNATS,
			"the door's address " + door + " (--listen) is taken and the data dir " + first + " (--data-dir) is in use by another compass-server dev (pid " + pid + "): stop it or give this one its own --listen and --data-dir"},
		{"same everything", first, door, natsAddr,
			"the door's address " + door + " (--listen) and the NATS address " + natsAddr + " (--nats-listen) are taken and the data dir " + first + " (--data-dir) is in use by another compass-server dev (pid " + pid + "): stop it or give this one its own --listen, --nats-listen and --data-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, statErr := os.Stat(tc.dir)
			existed := statErr == nil
			var before map[string]fileState
			if existed {
				before = runningDevFiles(tc.dir, first, snapshot(t, tc.dir))
			}
			firstBefore := runningDevFiles(first, first, snapshot(t, first))
			want := "server: dev: " + tc.want + " (nothing in " + tc.dir + " was changed)"
			ready := false
			err := devstack.Run(t.Context(), devstack.Config{DataDir: tc.dir, Listen: tc.listen, NATSListen: tc.natsListen,
				Ready: func(devstack.Info) { ready = true }})
			if err == nil || err.Error() != want || ready {
				t.Fatalf("second dev = %v (ready %v), want %q", err, ready, want)
			}
			code, stdout, stderr := runServer(t, nil, "dev", "--data-dir", tc.dir, "--listen", tc.listen, "--nats-listen", tc.natsListen)
			if code != 1 || stdout != "" || !strings.HasSuffix(stderr, "compass-server: "+want+"\n") {
				t.Fatalf("compass-server dev: code %d, stdout %q, stderr %q; want it to end %q", code, stdout, stderr, want)
			}
			if !existed {
				if _, err := os.Stat(tc.dir); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a refused dev created its data dir: %v", err)
				}
			} else if after := runningDevFiles(tc.dir, first, snapshot(t, tc.dir)); !maps.Equal(before, after) {
				t.Fatalf("a refused dev touched %s:\nbefore %v\nafter  %v", tc.dir, before, after)
			}
			if after := runningDevFiles(first, first, snapshot(t, first)); !maps.Equal(firstBefore, after) {
				t.Fatalf("a refused dev touched the first one's %s:\nbefore %v\nafter  %v", first, firstBefore, after)
			}
		})
	}
}

// The lock goes with the dev that held it: once the first dev stops, a dev
// in the same data dir starts (on other ports), so no stale lock is left to
// remove by hand. (A killed dev leaves none either, since the kernel drops a
// flock with the process's last descriptor; this test shows the clean stop.)
func TestDevDataDirIsFreeOnceTheFirstStops(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".data")
	ready := make(chan devstack.Info, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- devstack.Run(ctx, devstack.Config{DataDir: dir, Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:0",
			Ready: func(i devstack.Info) { ready <- i }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("first dev: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("first dev did not become ready")
	}
	err := devstack.Run(t.Context(), devstack.Config{DataDir: dir, Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "(--data-dir) is in use") {
		t.Fatalf("a second dev while the first runs = %v, want the data dir in use", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("first dev stopped with %v", err)
	}
	startDev(t, dir, "127.0.0.1:0", "127.0.0.1:0")
}
