package helm

import (
	"bytes"
	"testing"

	"github.com/compass-runner/identity/deploy"
)

// TestInstallNotesWarnOfASharedDeployer: what `helm install` prints after an
// install names the deployers, and warns while Flux's shared
// kustomize-controller (DL-440's default) is among them.
func TestInstallNotesWarnOfASharedDeployer(t *testing.T) {
	bin := Binary(t)
	chart := ChartDir(t)
	const warning = "WARNING: system:serviceaccount:flux-system:kustomize-controller, DL-440's default, is Flux's"
	base := map[string]any{"clusterName": "prod", "serverURL": "https://compass.example.com:8443"}
	notes := func(t *testing.T, vals ...map[string]any) []byte {
		t.Helper()
		files := WriteValues(t, append([]map[string]any{base}, vals...)...)
		args := []string{"install", Release, chart, "--namespace", Namespace, "--dry-run=client"}
		for _, f := range files {
			args = append(args, "-f", f)
		}
		r := Run(t, bin, args...)
		if r.Err != nil {
			t.Fatalf("helm install --dry-run=client: %v: %s", r.Err, r.Stderr)
		}
		i := bytes.Index(r.Stdout, []byte("\nNOTES:\n"))
		if i < 0 {
			t.Fatalf("no NOTES in what helm install printed:\n%s", r.Stdout)
		}
		return r.Stdout[i:]
	}
	t.Run("the default deployer", func(t *testing.T) {
		out := notes(t)
		for _, want := range []string{"  - " + deploy.DefaultDeployers[0], warning, deploy.ContainmentPolicyName} {
			if !bytes.Contains(out, []byte(want)) {
				t.Errorf("NOTES lack %q:\n%s", want, out)
			}
		}
	})
	t.Run("a deployer of its own", func(t *testing.T) {
		own := "system:serviceaccount:compass-deploy:runner-deployer"
		out := notes(t, map[string]any{"policy": map[string]any{"deployers": []string{own}}})
		if !bytes.Contains(out, []byte("  - "+own)) {
			t.Errorf("NOTES do not name %s:\n%s", own, out)
		}
		if bytes.Contains(out, []byte("WARNING")) {
			t.Errorf("NOTES warn with a deployer of its own:\n%s", out)
		}
	})
}
