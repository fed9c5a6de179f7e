package docs

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/compass-runner/identity/"

// layers is docs/architecture.md's table "Packages and what each may
// import": for every package of the module with non-test Go files (the
// tests' shared parts among them), exactly the repository packages those
// files import. A package missing from the table, an import the table does
// not list and an entry no file uses all fail: the table is the import
// graph, kept honest.
var layers = map[string][]string{
	// The basement: helpers every package may use, importing only each other.
	"internal/lib/atomicfile": {},
	"internal/lib/buildinfo":  {},
	"internal/lib/doorhttp":   {},
	"internal/lib/healthz":    {},
	"internal/lib/loopbackca": {},
	"internal/lib/natsretry":  {"internal/lib/natsurl"},
	"internal/lib/natsurl":    {},
	"internal/lib/testlog":    {},
	"internal/lib/testutil":   {},

	// The libraries: the concepts, and their test kits.
	"subjects":                              {},
	"gen/compass/admin/v1":                  {},
	"gen/compass/admin/v1/adminv1connect":   {"gen/compass/admin/v1"},
	"gen/compass/runner/v1":                 {},
	"gen/compass/runner/v1/runnerv1connect": {"gen/compass/runner/v1"},
	"verifier":                              {"podwatch", "subjects", "tokenreview"},
	"verifier/clusterfile":                  {"verifier"},
	"verifier/keymetrics":                   {"internal/lib/buildinfo", "verifier"},
	"verifier/verifiertest":                 {"kubeissuer", "verifier"},
	"tokenreview":                           {"internal/lib/bearerfile"},
	"podwatch":                              {"internal/lib/bearerfile"},
	"internal/lib/bearerfile":               {},
	"kick":                                  {},
	"kubeissuer":                            {"internal/lib/atomicfile"},
	"kubeissuer/testkeys":                   {"kubeissuer"},
	"store":                                 {"subjects", "verifier"},
	"store/storetest":                       {"internal/lib/testutil", "store", "verifier"},
	"door": {"gen/compass/admin/v1", "gen/compass/admin/v1/adminv1connect", "gen/compass/runner/v1",
		"gen/compass/runner/v1/runnerv1connect", "store", "subjects", "verifier"},
	"callout": {"internal/lib/healthz", "internal/lib/natsretry", "internal/lib/natsurl", "kick", "store", "subjects",
		"verifier", "verifier/clusterfile", "verifier/keymetrics"},
	"server": {"door", "internal/lib/healthz", "internal/lib/natsretry", "internal/lib/natsurl", "store", "subjects",
		"verifier", "verifier/clusterfile", "verifier/keymetrics"},
	"server/servertest": {"internal/lib/doorhttp", "internal/lib/loopbackca", "server", "store", "store/storetest"},
	"runner":            {"internal/lib/doorhttp", "internal/lib/natsretry", "internal/lib/natsurl", "subjects"},
	"runner/enroll":     {"gen/compass/runner/v1", "gen/compass/runner/v1/runnerv1connect", "runner"},
	"deploy":            {"deploy/chart", "internal/lib/natsurl"},
	"deploy/chart":      {},
	"deploy/deploytest": {"deploy"},
	"test/natsembed":    {"callout", "internal/lib/testlog", "kick"},
	"test/helm":         {"deploy/chart"},
	"test/kube":         {}, // a doc.go; the tier is its tests
	"test/node":         {}, // a doc.go; the tier is its tests (build tag nodetier)
	"tools/mutation":    {},

	// The wiring: the CLI toolkit, the three command lines and the dev
	// stack, which only the mains (and tests) import.
	"internal/wiring/cli": {"internal/lib/buildinfo"},
	"internal/wiring/commands": {"callout", "deploy", "gen/compass/admin/v1", "gen/compass/admin/v1/adminv1connect",
		"internal/lib/doorhttp", "internal/wiring/cli", "internal/wiring/devstack", "kick", "runner", "runner/enroll",
		"server", "store", "verifier", "verifier/keymetrics"},
	"internal/wiring/devstack": {"callout", "internal/lib/atomicfile", "internal/lib/loopbackca", "kick", "kubeissuer",
		"server", "verifier"},
	"cmd/compass-callout": {"internal/wiring/cli", "internal/wiring/commands"},
	"cmd/compass-runner":  {"internal/wiring/cli", "internal/wiring/commands"},
	"cmd/compass-server":  {"internal/wiring/cli", "internal/wiring/commands"},
}

// floor is the floor a package's folder says: 0 the basement
// (internal/lib), 2 the wiring (internal/wiring, cmd), 1 everything else.
func floor(pkg string) int {
	switch {
	case strings.HasPrefix(pkg, "internal/lib/"):
		return 0
	case strings.HasPrefix(pkg, "internal/wiring/"), strings.HasPrefix(pkg, "cmd/"):
		return 2
	}
	return 1
}

// forbidden are imports no library package may have outside the dev stack
// and the tests: the embedded nats-server belongs to internal/wiring/devstack
// and the test tiers.
var forbidden = map[string][]string{
	"server": {"github.com/nats-io/nats-server/v2/server", module + "kubeissuer"},
}

// Each package imports exactly what docs/architecture.md's table says;
// every arrow runs down or level (the basement imports only the basement,
// nothing below the wiring imports the wiring, no one imports a main); and
// every package is in the table.
func TestPackageLayers(t *testing.T) {
	root := ".."
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() && p != root {
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		if d.IsDir() && hasNonTestGo(t, p) {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			found[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	delete(found, "docs") // this package: tests only, and a doc.go
	for pkg := range found {
		if _, ok := layers[pkg]; !ok {
			t.Errorf("%s is not in the table (docs/layers_test.go, docs/architecture.md)", pkg)
		}
	}
	for pkg, allowed := range layers {
		if !found[pkg] {
			t.Errorf("%s is in the table but has no non-test Go files: is the package still there?", pkg)
			continue
		}
		var got []string
		for _, imp := range packageImports(t, filepath.Join(root, pkg)) {
			if slices.Contains(forbidden[pkg], imp) {
				t.Errorf("%s imports %s", pkg, imp)
			}
			if rel, ok := strings.CutPrefix(imp, module); ok {
				got = append(got, rel)
			}
		}
		for _, rel := range got {
			switch {
			case !slices.Contains(allowed, rel):
				t.Errorf("%s imports %s, which the table does not allow", pkg, rel)
			case strings.HasPrefix(rel, "cmd/"):
				t.Errorf("%s imports the main %s", pkg, rel)
			case floor(rel) > floor(pkg):
				t.Errorf("%s (floor %d) imports %s (floor %d): an upward arrow", pkg, floor(pkg), rel, floor(rel))
			}
		}
		for _, a := range allowed {
			if !slices.Contains(got, a) {
				t.Errorf("the table lets %s import %s, which none of its files does: remove it", pkg, a)
			}
			if floor(a) > floor(pkg) {
				t.Errorf("the table lets %s (floor %d) import %s (floor %d): an upward arrow", pkg, floor(pkg), a, floor(a))
			}
		}
	}
}

// hasNonTestGo reports whether dir holds a Go file that is not a test.
func hasNonTestGo(t *testing.T, dir string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(files, func(f string) bool { return !strings.HasSuffix(f, "_test.go") })
}

// packageImports lists the imports of the non-test Go files in dir.
func packageImports(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, is := range af.Imports {
			if imp := strings.Trim(is.Path.Value, `"`); !slices.Contains(out, imp) {
				out = append(out, imp)
			}
		}
	}
	return out
}
