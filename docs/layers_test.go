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
// import": the repository packages each library package's non-test files
// may import (a prefix ending in "/" allows a subtree).
var layers = map[string][]string{
	"verifier":             {"subjects"},
	"subjects":             {},
	"kick":                 {},
	"callout":              {"verifier", "subjects", "kick", "store", "internal/clusterfile", "internal/healthz", "internal/keymetrics", "internal/natsretry", "internal/natsurl"},
	"door":                 {"verifier", "subjects", "store", "gen/"},
	"store":                {"verifier", "subjects"},
	"server":               {"door", "store", "verifier", "subjects", "internal/"},
	"runner":               {"subjects", "internal/doorhttp", "internal/natsurl"},
	"deploy":               {"deploy/chart", "internal/natsurl"},
	"deploy/chart":         {},
	"internal/clusterfile": {"verifier"},
	"internal/healthz":     {},
	"internal/natsretry":   {"internal/natsurl"},
	"kubeissuer":           {"internal/atomicfile"},
}

// forbidden are imports no library package may have outside the dev stack
// and the tests: the embedded nats-server belongs to internal/devstack and
// the test tiers.
var forbidden = map[string][]string{
	"server": {"github.com/nats-io/nats-server/v2/server", module + "kubeissuer"},
}

// Each library package imports only what docs/architecture.md says it may,
// and nothing imports cmd/.
func TestPackageLayers(t *testing.T) {
	root := ".."
	for pkg, allowed := range layers {
		imports := packageImports(t, filepath.Join(root, pkg))
		if len(imports) == 0 {
			t.Fatalf("%s: no imports found: is the package still there?", pkg)
		}
		for _, imp := range imports {
			if slices.Contains(forbidden[pkg], imp) {
				t.Errorf("%s imports %s", pkg, imp)
			}
			rel, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if !slices.ContainsFunc(allowed, func(a string) bool {
				return rel == a || strings.HasSuffix(a, "/") && strings.HasPrefix(rel, a)
			}) {
				t.Errorf("%s imports %s, which docs/architecture.md does not allow", pkg, rel)
			}
		}
	}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			return nil
		}
		for _, imp := range packageImports(t, p) {
			if strings.HasPrefix(imp, module+"cmd/") {
				t.Errorf("%s imports %s", p, imp)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
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
