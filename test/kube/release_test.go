package kube

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/compass-runner/identity/test/helm"
)

// previousRelease is the commit whose compass-server renders the manifests an
// installation being upgraded runs: release v0.1.0 as it stood before the one
// migration policy (DL-453: the Server pod's init container migrated), the
// callout in the SQLite Server's pod (DL-452) and NATS day 2 (DL-454).
const previousRelease = "9a32819d7606320e3da2ae6065493340ae3930a3"

// buildServer builds this tree's compass-server into dir.
func buildServer(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "compass-server")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/compass-runner/identity/cmd/compass-server")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build compass-server: %v\n%s", err, out)
	}
	return bin
}

// buildPreviousServer builds compass-server as of previousRelease: the tree
// git archive gives for the commit, extracted into a temporary directory and
// built there (the Go build cache makes it a matter of seconds). Without the
// commit in the repository's history (a shallow clone) it fails under CI and
// skips otherwise, as the tier does without its binaries.
func buildPreviousServer(t *testing.T) string {
	t.Helper()
	root := helm.RepoRoot(t)
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("test/kube: commit %s (the previous release) is not in the repository's history: %v %s; fetch it (git fetch --unshallow)", previousRelease, err, bytes.TrimSpace(out))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + "; skipped because CI is unset")
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", previousRelease)
	var stderr bytes.Buffer
	archive.Stderr = &stderr
	stdout, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := archive.Start(); err != nil {
		t.Fatalf("git archive: %v", err)
	}
	if err := untar(stdout, src); err != nil {
		_ = archive.Wait()
		t.Fatalf("git archive %s: %v", previousRelease, err)
	}
	if err := archive.Wait(); err != nil {
		t.Fatalf("git archive %s: %v: %s", previousRelease, err, stderr.Bytes())
	}
	bin := filepath.Join(t.TempDir(), "compass-server-previous")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/compass-server")
	cmd.Dir = src
	// The extracted tree has no .git: stamping VCS information would fail.
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build compass-server at %s: %v\n%s", previousRelease, err, out)
	}
	return bin
}

// untar writes a tar stream's regular files and directories under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, dir+string(filepath.Separator)) {
			return fmt.Errorf("archive entry %q leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, name); err != nil {
				return err
			}
		}
	}
}

// renderWith runs bin's manifests command with args and parses the stream.
func renderWith(t *testing.T, bin string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, append([]string{"manifests"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s manifests %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, stderr.Bytes())
	}
	objs, err := splitManifests(stdout.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s manifests %s printed no object", filepath.Base(bin), strings.Join(args, " "))
	}
	return objs
}
