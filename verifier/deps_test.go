package verifier_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// nonStdDeps lists the packages outside the standard library that pkg
// imports, directly or not (tests excluded), as the go tool reports them.
func nonStdDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	var deps []string
	for _, p := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(p, "/")
		if strings.Contains(first, ".") {
			deps = append(deps, p)
		}
	}
	slices.Sort(deps)
	return deps
}

// A program that imports only the verifier gets JOSE, YAML and singleflight,
// and nothing of NATS, Kubernetes, databases, OpenTelemetry or Prometheus:
// the list is exact, so a new dependency is a decision (docs/verifier.md).
func TestVerifierDependencies(t *testing.T) {
	want := []string{
		"github.com/compass-runner/identity/internal/lib/bearerfile",
		"github.com/compass-runner/identity/podwatch",
		"github.com/compass-runner/identity/subjects",
		"github.com/compass-runner/identity/tokenreview",
		"github.com/compass-runner/identity/verifier",
		"github.com/go-jose/go-jose/v4",
		"github.com/go-jose/go-jose/v4/cipher",
		"github.com/go-jose/go-jose/v4/json",
		"github.com/go-jose/go-jose/v4/jwt",
		"go.yaml.in/yaml/v3",
		"golang.org/x/sync/singleflight",
	}
	if got := nonStdDeps(t, "github.com/compass-runner/identity/verifier"); !slices.Equal(got, want) {
		t.Fatalf("verifier imports\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if got := nonStdDeps(t, "github.com/compass-runner/identity/subjects"); !slices.Equal(got, []string{"github.com/compass-runner/identity/subjects"}) {
		t.Fatalf("subjects imports more than the standard library: %v", got)
	}
}
