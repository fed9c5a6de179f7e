package door_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// grpcurlTimeout bounds one grpcurl run against the loopback door.
const grpcurlTimeout = 30 * time.Second

// grpcurlBinary is the pinned grpcurl (COMPASS_TEST_GRPCURL, which .ci/test
// sets to the one .ci/tools.sh installs), or the end of the test: it fails
// under CI and skips otherwise.
func grpcurlBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("COMPASS_TEST_GRPCURL")
	msg := ""
	if path == "" {
		msg = "COMPASS_TEST_GRPCURL is not set (.ci/test sets it to the grpcurl .ci/tools.sh installs)"
	} else if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		msg = fmt.Sprintf("COMPASS_TEST_GRPCURL=%s is not a grpcurl binary", path)
	}
	if msg != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("door: " + msg)
		}
		t.Skip("door: " + msg + "; skipped because CI is not true")
	}
	return path
}

// grpcurl runs the binary with args and returns its exit code, stdout and
// stderr.
func grpcurl(t *testing.T, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), grpcurlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("grpcurl %q: %v", args, err)
	}
	return code, o.String(), e.String()
}

// grpcurl, as an operator runs it, against a real door with no -proto and no
// token: list and describe come from reflection, Health/Check answers
// SERVING, then NOT_SERVING once the store is closed, and a real RPC, whose
// request grpcurl builds from the reflected descriptor, is refused.
func TestGRPCurlListAndHealthCheck(t *testing.T) {
	bin := grpcurlBinary(t)
	var h *harness
	h = newHarness(t, harnessOpts{ready: func(ctx context.Context) error {
		_, err := h.st.SchemaVersion(ctx)
		return err
	}})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(h.url, "https://")
	for _, c := range []struct {
		flags, verb  []string // grpcurl [flags] address [verb]
		code         int
		stdout, errs string
	}{
		{verb: []string{"list"},
			stdout: "compass.admin.v1.AdminService\ncompass.runner.v1.RunnerService\ngrpc.health.v1.Health\n"},
		{verb: []string{"list", "compass.admin.v1.AdminService"},
			stdout: "compass.admin.v1.AdminService.ListRunners\ncompass.admin.v1.AdminService.PingRunner\n"},
		{verb: []string{"grpc.health.v1.Health/Check"}, stdout: "{\n  \"status\": \"SERVING\"\n}\n"},
		{flags: []string{"-d", `{"service":"compass.runner.v1.RunnerService"}`}, verb: []string{"grpc.health.v1.Health/Check"},
			stdout: "{\n  \"status\": \"SERVING\"\n}\n"},
		// grpcurl exits 64 + the gRPC code: Unauthenticated is 16.
		{verb: []string{"compass.admin.v1.AdminService/ListRunners"}, code: 64 + 16,
			errs: "ERROR:\n  Code: Unauthenticated\n  Message: unauthenticated\n"},
		{flags: []string{"-d", `{}`}, verb: []string{"compass.runner.v1.RunnerService/Enroll"}, code: 64 + 16,
			errs: "ERROR:\n  Code: Unauthenticated\n  Message: unauthenticated\n"},
	} {
		args := append(append(append([]string{"-cacert", ca}, c.flags...), addr), c.verb...)
		code, stdout, stderr := grpcurl(t, bin, args...)
		if code != c.code || stdout != c.stdout || stderr != c.errs {
			t.Fatalf("grpcurl %q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr %q",
				args, code, stdout, stderr, c.code, c.stdout, c.errs)
		}
	}

	if err := h.st.Close(); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := grpcurl(t, bin, "-cacert", ca, addr, "grpc.health.v1.Health/Check")
	if code != 0 || stdout != "{\n  \"status\": \"NOT_SERVING\"\n}\n" || stderr != "" {
		t.Fatalf("Check with the store closed: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
