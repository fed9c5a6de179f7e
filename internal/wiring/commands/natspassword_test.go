package commands_test

import (
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/wiring/cli"
)

// nats-password-hash prints the one line Secret compass-nats-users holds: a
// "$2a$" bcrypt hash at deploy.NATSPasswordCost of the password the file
// holds without its trailing newline, which is what the daemons send.
func TestNATSPasswordHash(t *testing.T) {
	dir := t.TempDir()
	const pw = "0f4c5e8d9a7b6c3d2e1f00112233445566778899aabbccddeeff001122334455" // openssl rand -hex 32
	file := writeFile(t, filepath.Join(dir, "callout-nats-password"), pw+"\n")

	check := func(t *testing.T, out string) {
		t.Helper()
		if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
			t.Fatalf("output %q: want one line", out)
		}
		h := strings.TrimSuffix(out, "\n")
		if !strings.HasPrefix(h, "$2a$11$") {
			t.Fatalf("hash %q: want the $2a$ form at cost 11", h)
		}
		if cost, err := bcrypt.Cost([]byte(h)); err != nil || cost != deploy.NATSPasswordCost {
			t.Fatalf("cost %d, %v; want %d", cost, err, deploy.NATSPasswordCost)
		}
		if err := bcrypt.CompareHashAndPassword([]byte(h), []byte(pw)); err != nil {
			t.Fatalf("the hash does not match the file's password without its newline: %v", err)
		}
		if bcrypt.CompareHashAndPassword([]byte(h), []byte(pw+"\n")) == nil {
			t.Fatal("the hash matches the password with its newline")
		}
		if strings.Contains(out, pw) {
			t.Fatal("the password is printed")
		}
	}
	t.Run("from a file", func(t *testing.T) {
		code, out, errOut := runServer(t, nil, "nats-password-hash", "--password-file", file)
		if code != cli.ExitOK || errOut != "" {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		check(t, out)
	})
	t.Run("from the environment", func(t *testing.T) {
		code, out, errOut := runServer(t, map[string]string{"COMPASS_NATS_PASSWORD": pw}, "nats-password-hash")
		if code != cli.ExitOK || errOut != "" {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		check(t, out)
	})

	long := strings.Repeat("a", 73)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string // in stderr
	}{
		{"no password", nil, nil, cli.ExitUsage, "give the password with --password-file or COMPASS_NATS_PASSWORD"},
		{"both", map[string]string{"COMPASS_NATS_PASSWORD": pw}, []string{"--password-file", file}, cli.ExitUsage, "set --password-file or COMPASS_NATS_PASSWORD, not both"},
		{"empty file", nil, []string{"--password-file", writeFile(t, filepath.Join(dir, "empty"), "\n")}, cli.ExitFailure, "--password-file: " + filepath.Join(dir, "empty") + ": file is empty"},
		{"longer than bcrypt reads", map[string]string{"COMPASS_NATS_PASSWORD": long}, nil, cli.ExitUsage, "deploy: nats password: 73 bytes, bcrypt reads at most 72 (openssl rand -hex 32 makes 64)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runServer(t, tc.env, append([]string{"nats-password-hash"}, tc.args...)...)
			if code != tc.code || out != "" || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, out, errOut, tc.code, tc.want)
			}
			if strings.Contains(errOut, pw) || strings.Contains(errOut, long) {
				t.Fatal("the password is in the error")
			}
		})
	}
}
