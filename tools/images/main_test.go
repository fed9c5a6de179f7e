package main

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const (
	testVersion  = "v0.1.0"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testEpoch    = 1764600000 // 2025-12-01T14:40:00Z
	testName     = "compass-fake"
)

// fixtures are binaries of testdata/fake, built once for the package's tests
// with the go command the tests run under.
var fixtures struct {
	good      string // built as .ci/images builds the daemons
	other     string // the same for the other arch (arm64 on amd64, amd64 on arm64)
	loose     string // CGO_ENABLED=1, no -trimpath, -ldflags "-s -w": every check on it fails
	goVersion string // the toolchain that built them, as the binary reports it
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "images-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		fixtures.good = filepath.Join(dir, "good", testName)
		fixtures.loose = filepath.Join(dir, "loose", testName)
		ldflags := "-w -X github.com/compass-runner/identity/internal/lib/buildinfo.version=" + testVersion +
			" -X github.com/compass-runner/identity/internal/lib/buildinfo.revision=" + testRevision
		fixtures.other = filepath.Join(dir, "other", testName)
		if err := goBuild(fixtures.good, "0", runtime.GOARCH, "-trimpath", "-ldflags", ldflags); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := goBuild(fixtures.other, "0", otherArch(), "-trimpath", "-ldflags", ldflags); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := goBuild(fixtures.loose, "1", runtime.GOARCH, "-ldflags", "-s -w"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bi, err := buildinfo.ReadFile(fixtures.good)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fixtures.goVersion = bi.GoVersion
		return m.Run()
	}()
	os.RemoveAll(dir)
	os.Exit(code)
}

// otherArch is the image arch that is not this machine's.
func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}

// goBuild builds testdata/fake's compass-fake for Linux on arch (this
// machine's, so the tests can run what they extract from an image, or the
// other one, for a multi-platform index).
func goBuild(out, cgo, arch string, args ...string) error {
	cmd := exec.Command("go", append(append([]string{"build", "-o", out}, args...), "./cmd/compass-fake")...)
	cmd.Dir = filepath.Join("testdata", "fake")
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOOS=linux", "GOARCH="+arch,
		"GOFLAGS=-buildvcs=false", "GOWORK=off", "GOEXPERIMENT=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the test fixture %s: %w\n%s", out, err, b)
	}
	return nil
}

func testSpec(t *testing.T) Spec {
	t.Helper()
	if _, ok := archs[runtime.GOARCH]; !ok {
		t.Fatalf("tests run on linux/amd64 or linux/arm64, not %s", runtime.GOARCH)
	}
	return Spec{
		Name:       testName,
		Version:    testVersion,
		Revision:   testRevision,
		Source:     defaultSource,
		Repository: defaultRepository,
		Arch:       runtime.GOARCH,
		Created:    time.Unix(testEpoch, 0).UTC(),
	}
}

// specArgs are the command-line flags for testSpec.
func specArgs() []string {
	return []string{"--name", testName, "--version", testVersion, "--revision", testRevision,
		"--arch", runtime.GOARCH, "--source-date-epoch", fmt.Sprint(testEpoch)}
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb strings.Builder
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCLIBuildThenCheckThenRun(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	dir := filepath.Join(t.TempDir(), "layout")
	code, out, errOut := runCLI(t, append([]string{"build", "--binary", fixtures.good, "--out", dir}, specArgs()...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("build: exit %d, stderr %q", code, errOut)
	}
	img, err := Build(testSpec(t), mustRead(t, fixtures.good))
	if err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref := "ghcr.io/compass-runner/compass-fake:v0.1.0"
	if want := testName + " " + ref + " " + digest.String() + "\n"; out != want {
		t.Fatalf("build printed %q, want %q", out, want)
	}

	bin := filepath.Join(t.TempDir(), "extracted")
	code, out, errOut = runCLI(t, append([]string{"check", "--layout", dir, "--extract", bin}, specArgs()...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("check: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{
		ref + " " + digest.String(),
		`  user 65532:65532, entrypoint ["/usr/local/bin/compass-fake"], no shell (the entrypoint is the only executable)`,
		"  label org.opencontainers.image.title=compass-fake",
		"  label org.opencontainers.image.version=v0.1.0",
		"  label org.opencontainers.image.revision=" + testRevision,
		"  label org.opencontainers.image.source=https://github.com/compass-runner/identity",
		"  label org.opencontainers.image.created=2025-12-01T14:40:00Z",
	}
	if len(lines) != len(want)+3 {
		t.Fatalf("check printed %d lines, want %d:\n%s", len(lines), len(want)+3, out)
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("check line %d is %q, want %q", i+1, lines[i], w)
		}
	}
	for i, prefix := range []string{"  layer 1 sha256:", "  layer 2 sha256:", "  CA bundle /etc/ssl/certs/ca-certificates.crt: "} {
		if l := lines[len(want)+i]; !strings.HasPrefix(l, prefix) {
			t.Errorf("check line %d is %q, want it to start %q", len(want)+i+1, l, prefix)
		}
	}

	// What came out of the image runs and reports the stamped build.
	got, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("running the extracted binary: %v: %s", err, got)
	}
	if want := fmt.Sprintf("compass-fake v0.1.0 (revision %s, %s)\n", testRevision, fixtures.goVersion); string(got) != want {
		t.Fatalf("extracted binary --version printed %q, want %q", got, want)
	}
}

func TestCLISourceDateEpochFromEnvironment(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1764603600")
	dir := filepath.Join(t.TempDir(), "layout")
	args := []string{"build", "--binary", fixtures.good, "--out", dir, "--name", testName,
		"--version", testVersion, "--revision", testRevision, "--arch", runtime.GOARCH}
	if code, _, errOut := runCLI(t, args...); code != 0 {
		t.Fatalf("build: exit %d, stderr %q", code, errOut)
	}
	s := testSpec(t)
	s.Created = time.Unix(1764603600, 0).UTC()
	if _, err := Check(dir, s, ""); err != nil {
		t.Fatalf("the image is not stamped with $SOURCE_DATE_EPOCH: %v", err)
	}
}

func TestCLIUsageErrors(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	out := filepath.Join(t.TempDir(), "layout")
	base := []string{"build", "--binary", fixtures.good, "--out", out}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, usage + "\n"},
		{"unknown command", []string{"publish"}, "images: unknown command \"publish\"\n" + usage + "\n"},
		{"unknown flag", []string{"build", "--tag", "x"}, "images: flag provided but not defined: -tag\n" + usage + "\n"},
		{"no binary", []string{"build", "--out", out}, "images: --binary and --out are required\n" + usage + "\n"},
		{"no layout", []string{"check"}, "images: --layout is required\n" + usage + "\n"},
		{"extra argument", append(append([]string{}, base...), "more"), "images: unexpected arguments [\"more\"]\n" + usage + "\n"},
		{"no epoch", append(append([]string{}, base...), "--name", testName), "images: --source-date-epoch (or SOURCE_DATE_EPOCH) is required\n" + usage + "\n"},
		{"bad epoch", append(append([]string{}, base...), "--source-date-epoch", "yesterday"), "images: --source-date-epoch \"yesterday\" is not a whole number of seconds\n" + usage + "\n"},
		{"negative epoch", append(append([]string{}, base...), "--source-date-epoch", "-1"), "images: --source-date-epoch -1 is not from 0 to 253402300799 (year 9999)\n" + usage + "\n"},
		{"bad spec", append(append([]string{}, base...), "--source-date-epoch", "0", "--name", "Compass", "--version", "0.1.0", "--revision", testRevision),
			"images: name \"Compass\" is not lower-case letters and digits joined by single hyphens, at most 63 characters\n" +
				"version \"0.1.0\" is not a semantic version with a leading v and no build metadata (v1.2.3, v1.2.3-rc.1)\n" + usage + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			if code != 2 || stdout != "" || stderr != tc.want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2, stderr %q", code, stdout, stderr, tc.want)
			}
		})
	}
	if _, err := os.Lstat(out); err == nil {
		t.Fatal("a usage error wrote a layout")
	}
}

func TestCLIHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"build", "-h"}, {"check", "--help"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 || stderr != "" {
			t.Fatalf("%q: exit %d, stderr %q", args, code, stderr)
		}
		want := usage
		if len(args) == 2 {
			want = "Usage of images " + args[0] + ":"
		}
		if !strings.HasPrefix(stdout, want) {
			t.Fatalf("%q printed %q, want it to start %q", args, stdout, want)
		}
	}
}

func TestCLICheckFailureExitsOne(t *testing.T) {
	dir := writeImage(t, testSpec(t), fixtures.good)
	args := []string{"check", "--layout", dir, "--name", testName, "--version", "v0.2.0", "--revision", testRevision,
		"--arch", runtime.GOARCH, "--source-date-epoch", fmt.Sprint(testEpoch)}
	code, stdout, stderr := runCLI(t, args...)
	if code != 1 || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want exit 1 and nothing on stdout", code, stdout)
	}
	want := fmt.Sprintf("images: check %s (ghcr.io/compass-runner/compass-fake:v0.2.0):\n  index entry annotations are", dir)
	if !strings.HasPrefix(stderr, want) {
		t.Fatalf("stderr %q, want it to start %q", stderr, want)
	}
	if !strings.HasSuffix(stderr, "\n  /usr/local/bin/compass-fake: binary's linked version (-X github.com/compass-runner/identity/internal/lib/buildinfo.version) is \"v0.1.0\", not \"v0.2.0\"\n") {
		t.Fatalf("stderr %q does not end with the binary's version mismatch", stderr)
	}
}

func TestCLIBuildFailureExitsOne(t *testing.T) {
	out := filepath.Join(t.TempDir(), "layout")
	code, stdout, stderr := runCLI(t, append([]string{"build", "--binary", filepath.Join(t.TempDir(), "missing"), "--out", out}, specArgs()...)...)
	if code != 1 || stdout != "" || !strings.HasPrefix(stderr, "images: binary: open ") || !strings.HasSuffix(stderr, ": no such file or directory\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and the open error", code, stdout, stderr)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeImage builds the image of binary for s into a new layout and returns
// the layout's directory.
func writeImage(t *testing.T, s Spec, binary string) string {
	t.Helper()
	img, err := Build(s, mustRead(t, binary))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	if _, err := WriteLayout(dir, s, img); err != nil {
		t.Fatal(err)
	}
	return dir
}
