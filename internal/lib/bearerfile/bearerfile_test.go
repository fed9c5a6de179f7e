package bearerfile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/internal/lib/bearerfile"
)

// A token is read, read again when the file is replaced (as the kubelet
// rotates a projected token), and refused with exactly these errors when
// empty, too long or not visible ASCII; the errors never quote the token.
func TestToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	write := func(v string) {
		t.Helper()
		tmp := filepath.Join(dir, "new")
		if err := os.WriteFile(tmp, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	f := &bearerfile.File{Path: path, Max: 16}
	write("first-token\n")
	if v, err := f.Token(); err != nil || v != "first-token" {
		t.Fatalf("Token = %q, %v", v, err)
	}
	write("second-token")
	if v, err := f.Token(); err != nil || v != "second-token" {
		t.Fatalf("after the rotation: Token = %q, %v", v, err)
	}
	for _, tc := range []struct{ content, want string }{
		{"  \n", path + " is empty"},
		{strings.Repeat("s", 17), path + " is longer than 16 bytes"},
		{"secret value", path + " holds a character not allowed in a bearer token"},
	} {
		write(tc.content)
		if _, err := f.Token(); err == nil || err.Error() != tc.want {
			t.Errorf("%q: error %v, want %q", tc.content, err, tc.want)
		}
	}
	if _, err := f.Token(); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("the error quotes the token: %v", err)
	}
}
