package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// tampered writes img, named for s, into a new layout.
func tampered(t *testing.T, s Spec, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	if _, err := WriteLayout(dir, s, img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// assembled is the image of s from the given entries, each layer's tar
// stamped with its own time.
func assembled(t *testing.T, s Spec, base, top []entry, baseTime, topTime time.Time) v1.Image {
	t.Helper()
	bt, err := layerTar(base, baseTime)
	if err != nil {
		t.Fatal(err)
	}
	tt, err := layerTar(top, topTime)
	if err != nil {
		t.Fatal(err)
	}
	img, err := assemble(s, bt, tt)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func wantCheckError(t *testing.T, dir string, s Spec, want ...string) {
	t.Helper()
	extract := filepath.Join(t.TempDir(), "bin")
	_, err := Check(dir, s, extract)
	if err == nil {
		t.Fatalf("Check passed; want:\n%s", strings.Join(want, "\n"))
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Fatalf("Check:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if _, err := os.Lstat(extract); err == nil {
		t.Fatal("Check extracted the binary of an image that failed")
	}
}

func baseAndTop(t *testing.T, s Spec) ([]entry, []entry) {
	t.Helper()
	ca, _, err := caBundle()
	if err != nil {
		t.Fatal(err)
	}
	return baseEntries(ca), binaryEntries(s, mustRead(t, fixtures.good))
}

// builtWithConfig is the image Build makes of the good fixture for s, and
// its config file, for a test to tamper with.
func builtWithConfig(t *testing.T, s Spec) (v1.Image, *v1.ConfigFile) {
	t.Helper()
	img := built(t, s)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return img, cf
}

func TestCheckCatchesARootUser(t *testing.T) {
	s := testSpec(t)
	img, cf := builtWithConfig(t, s)
	cfg := cf.Config
	cfg.User = "0"
	cfg.Cmd = []string{"--help"}
	cfg.StopSignal = "SIGKILL"
	img, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wantCheckError(t, tampered(t, s, img), s,
		`config user is "0", not "65532:65532"`,
		`config cmd is ["--help"], not empty`,
		`config sets more than user, entrypoint, env, working dir and labels: `+fmt.Sprintf("%+v", v1.Config{StopSignal: "SIGKILL"}),
	)
}

func TestCheckCatchesAShell(t *testing.T) {
	s := testSpec(t)
	base, top := baseAndTop(t, s)
	withShell := append([]entry{{Name: "bin/", Mode: 0o755}, {Name: "bin/sh", Mode: 0o755, Data: []byte("\x7fELF")}}, base...)
	img := assembled(t, s, withShell, top, s.Created, s.Created)
	wantCheckError(t, tampered(t, s, img), s,
		"layer 1: unexpected entry /bin/",
		"layer 1: unexpected entry /bin/sh (a shell)",
		"layer 1: entries are [bin/ bin/sh etc/ etc/group etc/passwd etc/ssl/ etc/ssl/certs/ etc/ssl/certs/ca-certificates.crt home/ home/nonroot/ tmp/], "+
			"not [etc/ etc/group etc/passwd etc/ssl/ etc/ssl/certs/ etc/ssl/certs/ca-certificates.crt home/ home/nonroot/ tmp/]",
		"the executables in the image are [/bin/sh /usr/local/bin/compass-fake], not only /usr/local/bin/compass-fake",
	)
}

func TestCheckCatchesABuildTimeTimestamp(t *testing.T) {
	s := testSpec(t)
	base, top := baseAndTop(t, s)
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	img := assembled(t, s, base, top, s.Created, now)
	wantCheckError(t, tampered(t, s, img), s,
		"layer 2: /usr/ has mtime 2026-03-04T05:06:07Z, not 2025-12-01T14:40:00Z",
		"layer 2: /usr/local/ has mtime 2026-03-04T05:06:07Z, not 2025-12-01T14:40:00Z",
		"layer 2: /usr/local/bin/ has mtime 2026-03-04T05:06:07Z, not 2025-12-01T14:40:00Z",
		"layer 2: /usr/local/bin/compass-fake has mtime 2026-03-04T05:06:07Z, not 2025-12-01T14:40:00Z",
	)
}

func TestCheckCatchesWritableBinaryAndOtherRoots(t *testing.T) {
	s := testSpec(t)
	base, top := baseAndTop(t, s)
	for i := range base {
		if "/"+base[i].Name == caFile {
			base[i].Data = []byte("-----BEGIN CERTIFICATE-----\n")
		}
	}
	top[3].Mode, top[3].UID, top[3].GID = 0o755, nonroot, nonroot
	img := assembled(t, s, base, top, s.Created, s.Created)
	wantCheckError(t, tampered(t, s, img), s,
		"layer 1: /etc/ssl/certs/ca-certificates.crt has other contents (28 bytes, not "+fmt.Sprint(len(mustCABundle(t)))+")",
		"layer 2: /usr/local/bin/compass-fake is mode 0755 owner 65532:65532 (\"\":\"\"), not mode 0555 owner 0:0",
	)
}

func mustCABundle(t *testing.T) []byte {
	t.Helper()
	b, _, err := caBundle()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckCatchesAnotherSpec(t *testing.T) {
	s := testSpec(t)
	dir := writeImage(t, s, fixtures.good)
	other := s
	other.Repository = "registry.example.com/compass"
	other.Source = "https://example.com/compass"
	wantCheckError(t, dir, other,
		"index entry annotations are map[org.opencontainers.image.ref.name:ghcr.io/compass-runner/compass-fake:v0.1.0], "+
			"not org.opencontainers.image.ref.name=registry.example.com/compass/compass-fake:v0.1.0",
		"manifest annotations are "+fmt.Sprint(s.Labels())+", not "+fmt.Sprint(other.Labels()),
		"config labels are "+fmt.Sprint(s.Labels())+", not "+fmt.Sprint(other.Labels()),
	)
}

func TestCheckCatchesACorruptBlob(t *testing.T) {
	s := testSpec(t)
	dir := writeImage(t, s, fixtures.good)
	img, digest := layoutImage(t, dir)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, err := layers[1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "blobs", ld.Algorithm, ld.Hex)
	b := mustRead(t, p)
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Check(dir, s, "")
	prefix := fmt.Sprintf("image %s does not validate: ", digest)
	if err == nil || !strings.HasPrefix(err.Error(), prefix) {
		t.Fatalf("Check of a flipped byte: %v, want it to start %q", err, prefix)
	}
}

func TestCheckCatchesTwoImagesInALayout(t *testing.T) {
	s := testSpec(t)
	dir := writeImage(t, s, fixtures.good)
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	later := s
	later.Created = s.Created.Add(time.Hour)
	img, err := Build(later, mustRead(t, fixtures.good))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(dir, s, ""); err == nil || err.Error() != "layout "+dir+": index has 2 manifests, not 1" {
		t.Fatalf("two images: %v", err)
	}
}

func TestCheckCatchesAnotherPlatformAndNoLayout(t *testing.T) {
	s := testSpec(t)
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := Check(missing, s, ""); err == nil || !strings.HasPrefix(err.Error(), "layout "+missing+": ") {
		t.Fatalf("no layout: %v", err)
	}
	img, cf := builtWithConfig(t, s)
	cf = cf.DeepCopy()
	cf.OS = "windows"
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	wantCheckError(t, tampered(t, s, img), s,
		fmt.Sprintf("config platform is windows/%s, not linux/%s", s.Arch, s.Arch)+variantSuffix(archs[s.Arch]),
	)
}
