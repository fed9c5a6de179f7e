// Package helm runs the pinned helm binary (.ci/tools.sh builds it into
// .bin/tools) against the Compass chart, deploy/chart/compass, for the tests
// that prove `compass-server manifests` and Helm print the same objects from
// that one template source: this package's own tests, and the live
// API-server tier's (test/kube), which applies what helm template prints.
//
// The renderer in deploy/chart reimplements the part of Helm's engine the
// chart uses. A difference between the two (a Sprig function Helm overrides,
// how Helm coalesces values, how it orders or splits documents) would go
// unseen by every test that renders through deploy alone, and an operator
// installing with Helm would run objects no test applied. Here the real
// binary is the reference.
package helm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy/chart"
)

// Release and Namespace are the release name and namespace every helm
// command here uses: those deploy.Render renders as (the chart names its
// namespaces from values, not from the release).
const (
	Release   = "compass"
	Namespace = "compass-system"
)

// runTimeout bounds one helm command: a template or lint of this chart
// takes tens of milliseconds.
const runTimeout = 2 * time.Minute

// RepoRoot is the module's root, the nearest directory above the working
// directory (a test's package directory) holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("test/helm: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("test/helm: no go.mod above the working directory")
		}
		dir = parent
	}
}

// ChartDir is the chart's directory, deploy/chart/compass.
func ChartDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(RepoRoot(t), "deploy", "chart", "compass")
}

// EmbeddedChart writes the chart deploy/chart embeds (chart.FS, what
// manifests renders) into a directory of its own, removed when the test
// ends, and returns it: helm given this directory renders the very files
// the renderer does, so a comparison is of the two engines alone, even
// when the chart on disk was edited after the test binary was built.
func EmbeddedChart(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "compass-helm-chart-")
	if err != nil {
		t.Fatalf("test/helm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	dir = filepath.Join(dir, chart.Name)
	if err := os.CopyFS(dir, chart.FS()); err != nil {
		t.Fatalf("test/helm: the embedded chart: %v", err)
	}
	return dir
}

// Binary is the pinned helm: $COMPASS_TEST_HELM (.ci/test sets it), else
// .bin/tools/helm under the module's root, where .ci/tools.sh installs it.
// Without it the test fails when CI is set (the tier must run there) and is
// skipped otherwise, saying why.
func Binary(t testing.TB) string {
	t.Helper()
	path := os.Getenv("COMPASS_TEST_HELM")
	from := "COMPASS_TEST_HELM"
	if path == "" {
		path = filepath.Join(RepoRoot(t), ".bin", "tools", "helm")
		from = "the default (COMPASS_TEST_HELM unset)"
	}
	fi, err := os.Stat(path)
	if err == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		msg := fmt.Sprintf("test/helm: helm %s from %s: %v; build it with .ci/tools.sh (or set COMPASS_TEST_HELM)", path, from, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + "; skipped because CI is unset")
	}
	return path
}

// Result is what one helm command did.
type Result struct {
	Stdout, Stderr []byte
	Err            error // nil, or the exit error
}

// Run runs bin with args in a home of its own (no repository, cache or
// plugin of the user's is read), at most runTimeout.
func Run(t testing.TB, bin string, args ...string) Result {
	t.Helper()
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"HELM_PLUGINS="+filepath.Join(home, "plugins"),
		"KUBECONFIG="+filepath.Join(home, "kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("test/helm: helm %s: no answer in %s", strings.Join(args, " "), runTimeout)
	}
	return Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Err: err}
}

// As are helm's flags to act as user, in groups and system:authenticated,
// through kubeconfig, whose credentials may impersonate (system:masters).
func As(kubeconfig, user string, groups ...string) []string {
	a := []string{"--kubeconfig", kubeconfig, "--kube-as-user", user}
	for _, g := range append(groups, "system:authenticated") {
		a = append(a, "--kube-as-group", g)
	}
	return a
}

// WriteValues writes each map as a values file and returns the files, in
// order, for -f: helm coalesces later files over earlier ones. The files
// are in a directory of their own whose path has no comma (helm splits -f
// at commas, and a subtest's t.TempDir carries its name's), removed when
// the test ends.
func WriteValues(t testing.TB, vals ...map[string]any) []string {
	t.Helper()
	dir, err := os.MkdirTemp("", "compass-helm-values-")
	if err != nil {
		t.Fatalf("test/helm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if strings.Contains(dir, ",") {
		t.Fatalf("test/helm: the temporary directory %s has a comma, which helm's -f splits at", dir)
	}
	var files []string
	for i, v := range vals {
		data, err := yaml.Marshal(v)
		if err != nil {
			t.Fatalf("test/helm: values: %v", err)
		}
		f := filepath.Join(dir, fmt.Sprintf("values-%d.yaml", i))
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatalf("test/helm: %v", err)
		}
		files = append(files, f)
	}
	return files
}

// TemplateArgs are the arguments of `helm template` for the chart with the
// values files, then extra (--set, --show-only).
func TemplateArgs(chartDir string, files []string, extra ...string) []string {
	args := []string{"template", Release, chartDir, "--namespace", Namespace}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return append(args, extra...)
}

// Template runs `helm template` on the chart in chartDir (ChartDir,
// EmbeddedChart) with vals (later maps over earlier ones) and returns what
// it printed, failing the test when it refuses.
func Template(t testing.TB, bin, chartDir string, vals []map[string]any, extra ...string) []byte {
	t.Helper()
	files := WriteValues(t, vals...)
	r := Run(t, bin, TemplateArgs(chartDir, files, extra...)...)
	if r.Err != nil {
		t.Fatalf("test/helm: helm template: %v: %s", r.Err, r.Stderr)
	}
	return r.Stdout
}
