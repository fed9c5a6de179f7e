package tokenreview_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/compass-runner/identity/tokenreview"
	"github.com/compass-runner/identity/verifier"
)

// The package imports the standard library only (and the project's
// internal/lib/bearerfile, which does too): the verifier, whose
// dependency list is exact (verifier/deps_test.go), is to import it, and the
// daemons stay without a Kubernetes client.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/compass-runner/identity/tokenreview").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(p, "/")
		if strings.Contains(first, ".") && p != "github.com/compass-runner/identity/tokenreview" && p != "github.com/compass-runner/identity/internal/lib/bearerfile" {
			t.Errorf("tokenreview imports %s", p)
		}
	}
}

// A token the verifier would refuse for its length is refused here without
// a request, and one it would verify is reviewed: the two caps are one.
func TestMaxTokenBytesIsTheVerifiers(t *testing.T) {
	if tokenreview.MaxTokenBytes != verifier.MaxTokenBytes {
		t.Fatalf("MaxTokenBytes = %d, verifier.MaxTokenBytes = %d", tokenreview.MaxTokenBytes, verifier.MaxTokenBytes)
	}
}
