package doorhttp

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClientRefusesWhatIsNotHTTPS(t *testing.T) {
	for _, bad := range []string{"http://server:8443", "server:8443", "", "://x", "https://"} {
		if _, err := Client(bad, ""); !errors.Is(err, ErrServerURL) {
			t.Errorf("Client(%q) = %v, want ErrServerURL", bad, err)
		}
	}
}

func TestClientCAFile(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Client("https://server:8443", notPEM); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("non-PEM CA file: %v", err)
	}
	if _, err := Client("https://server:8443", filepath.Join(dir, "missing.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing CA file: %v, want a not-exist error", err)
	}
	hc, err := Client("https://server:8443", "")
	if err != nil || hc == nil {
		t.Fatalf("no CA file: %v", err)
	}
}
