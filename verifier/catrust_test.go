package verifier

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
)

// childEnv marks the re-executed test process of TestCAFileIsTheOnlyTrust.
const childEnv = "COMPASS_VERIFIER_SYSTEM_ROOTS_CHILD"

// A cluster's caFile is the whole of its trust: an issuer whose certificate
// comes from a CA the system trusts, but not from caFile, is refused; the
// same issuer without caFile is fetched through the system roots. The system
// roots are read once per process (SSL_CERT_FILE), so the check runs in a
// child process of its own.
func TestCAFileIsTheOnlyTrust(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCAFileIsTheOnlyTrust$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "system roots: trusted; caFile of another CA: refused") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	sys := newIssuer(t, kubeissuer.RS256, nil)   // its CA becomes a system root
	other := newIssuer(t, kubeissuer.RS256, nil) // its CA goes in caFile
	dir := t.TempDir()
	sysCA := filepath.Join(dir, "system.pem")
	if err := sys.WriteCAFile(sysCA); err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(dir, "other.pem")
	if err := other.WriteCAFile(otherCA); err != nil {
		t.Fatal(err)
	}
	// Before anything in this process reads the system roots.
	os.Setenv("SSL_CERT_FILE", sysCA)
	os.Setenv("SSL_CERT_DIR", dir)

	plain, err := New([]RunnerCluster{{Name: "sys", Issuer: sys.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Refresh(t.Context()); err != nil {
		t.Fatalf("without caFile, through the system roots: %v", err)
	}
	pinned, err := New([]RunnerCluster{{Name: "sys", Issuer: sys.URL(), CAFile: otherCA}})
	if err != nil {
		t.Fatal(err)
	}
	err = pinned.Refresh(t.Context())
	if err == nil || !strings.Contains(err.Error(), "x509: certificate signed by unknown authority") {
		t.Fatalf("with caFile of another CA: %v, want the system-trusted certificate refused", err)
	}
	t.Log("system roots: trusted; caFile of another CA: refused")
}
