package podwatch_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The package imports the standard library only (and the project's
// internal/lib/bearerfile, which does too): the verifier is to
// import it, and the daemons stay without a Kubernetes client.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/compass-runner/identity/podwatch").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(p, "/")
		if strings.Contains(first, ".") && p != "github.com/compass-runner/identity/podwatch" && p != "github.com/compass-runner/identity/internal/lib/bearerfile" {
			t.Errorf("podwatch imports %s", p)
		}
	}
}
