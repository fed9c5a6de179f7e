package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// layoutFiles maps every file of a layout, by its path under dir, to its
// bytes.
func layoutFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestBuildIsReproducible(t *testing.T) {
	s := testSpec(t)
	a, b := writeImage(t, s, fixtures.good), writeImage(t, s, fixtures.good)
	fa, fb := layoutFiles(t, a), layoutFiles(t, b)
	if len(fa) != 6 { // oci-layout, index.json, manifest, config, two layers
		t.Fatalf("layout has %d files, want 6: %v", len(fa), slices.Sorted(mapsKeys(fa)))
	}
	for name, ba := range fa {
		if !bytes.Equal(ba, fb[name]) {
			t.Errorf("%s differs between two builds of the same binary and spec", name)
		}
	}
	if len(fb) != len(fa) {
		t.Errorf("the second build wrote %d files, the first %d", len(fb), len(fa))
	}

	// The timestamp is in the image: another SOURCE_DATE_EPOCH, another digest.
	later := s
	later.Created = s.Created.Add(time.Second)
	d1 := digestOf(t, s, fixtures.good)
	if d2 := digestOf(t, later, fixtures.good); d1 == d2 {
		t.Fatalf("images created a second apart have the same digest %s", d1)
	}
}

func mapsKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func digestOf(t *testing.T, s Spec, binary string) v1.Hash {
	t.Helper()
	img, err := Build(s, mustRead(t, binary))
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestImagesShareTheBaseLayer(t *testing.T) {
	s := testSpec(t)
	other := s
	other.Name = "compass-other"
	la, lb := layerDigests(t, s), layerDigests(t, other)
	if la[0] != lb[0] {
		t.Fatalf("base layers differ between two programs: %s, %s", la[0], lb[0])
	}
	if la[1] == lb[1] {
		t.Fatalf("binary layers of two programs are the same %s, though the paths differ", la[1])
	}
}

func layerDigests(t *testing.T, s Spec) []v1.Hash {
	t.Helper()
	ls, err := built(t, s).Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []v1.Hash
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func TestCheckReportsTheImage(t *testing.T) {
	s := testSpec(t)
	s.Licenses = "Apache-2.0"
	dir := writeImage(t, s, fixtures.good)
	bin := filepath.Join(t.TempDir(), "bin")
	rep, err := Check(dir, s, bin)
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":    "compass-fake",
		"org.opencontainers.image.version":  "v0.1.0",
		"org.opencontainers.image.revision": testRevision,
		"org.opencontainers.image.source":   "https://github.com/compass-runner/identity",
		"org.opencontainers.image.created":  "2025-12-01T14:40:00Z",
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	if fmt.Sprint(rep.Labels) != fmt.Sprint(wantLabels) {
		t.Errorf("labels %v, want %v", rep.Labels, wantLabels)
	}
	if rep.User != "65532:65532" || !slices.Equal(rep.Entrypoint, []string{"/usr/local/bin/compass-fake"}) {
		t.Errorf("user %q entrypoint %q", rep.User, rep.Entrypoint)
	}
	if rep.Ref != "ghcr.io/compass-runner/compass-fake:v0.1.0" {
		t.Errorf("ref %q", rep.Ref)
	}
	if len(rep.Layers) != 2 || rep.Layers[0].Entries != 9 || rep.Layers[1].Entries != 4 {
		t.Errorf("layers %+v, want 9 entries then 4", rep.Layers)
	}
	want := mustRead(t, fixtures.good)
	sum := sha256.Sum256(want)
	if rep.BinarySize != len(want) || rep.BinarySum != hex.EncodeToString(sum[:]) {
		t.Errorf("binary %d bytes sha256 %s, want %d bytes %x", rep.BinarySize, rep.BinarySum, len(want), sum)
	}
	if got := mustRead(t, bin); !bytes.Equal(got, want) {
		t.Fatal("the extracted binary is not the one built into the image")
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("extracted binary: %v, mode %v, want 0755", err, fi.Mode())
	}
	if d := digestOf(t, s, fixtures.good); rep.Digest != d {
		t.Fatalf("check read digest %s, build made %s", rep.Digest, d)
	}
}

// built is the image Build makes of the good fixture for s.
func built(t *testing.T, s Spec) v1.Image {
	t.Helper()
	img, err := Build(s, mustRead(t, fixtures.good))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// layoutImage reads back the first image of the OCI layout at dir, as a
// registry client would find it, with the digest its index entry names.
func layoutImage(t *testing.T, dir string) (v1.Image, v1.Hash) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im.Manifests[0].Digest
}

// The image's files, read back through the layout, are exactly these: the
// user database, the CA bundle, the home and /tmp, the binary.
func TestImageFilesystem(t *testing.T) {
	s := testSpec(t)
	dir := writeImage(t, s, fixtures.good)
	img, _ := layoutImage(t, dir)
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var got []string
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(s.Created) {
			t.Errorf("%s has mtime %s, want %s", h.Name, h.ModTime, s.Created)
		}
		got = append(got, fmt.Sprintf("%s %o %d:%d", h.Name, h.Mode, h.Uid, h.Gid))
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
	want := []string{
		// mutate.Extract drops a directory's trailing slash.
		"etc 755 0:0", "etc/group 644 0:0", "etc/passwd 644 0:0", "etc/ssl 755 0:0", "etc/ssl/certs 755 0:0",
		"etc/ssl/certs/ca-certificates.crt 644 0:0", "home 755 0:0", "home/nonroot 700 65532:65532", "tmp 1777 0:0",
		"usr 755 0:0", "usr/local 755 0:0", "usr/local/bin 755 0:0", "usr/local/bin/compass-fake 555 0:0",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("image files:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if p := string(files["etc/passwd"]); !strings.Contains(p, "\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") {
		t.Errorf("/etc/passwd has no nonroot user 65532: %q", p)
	}
	if g := string(files["etc/group"]); !strings.Contains(g, "\nnonroot:x:65532:\n") {
		t.Errorf("/etc/group has no nonroot group 65532: %q", g)
	}
	if n := bytes.Count(files["etc/ssl/certs/ca-certificates.crt"], []byte("-----BEGIN CERTIFICATE-----")); n < 100 {
		t.Errorf("the CA bundle has %d certificates, want the NSS roots (over 100)", n)
	}
}

func TestCABundleIsTheUnconstrainedNSSRoots(t *testing.T) {
	pemBytes, n, err := caBundle()
	if err != nil {
		t.Fatal(err)
	}
	var want, constrained [][]byte
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			constrained = append(constrained, r.Certificate)
		} else {
			want = append(want, r.Certificate)
		}
	}
	// The pinned x509roots/fallback has a root distrusted after a date; an
	// update without one leaves the exclusion untested, so say so here.
	if len(constrained) == 0 {
		t.Fatal("the pinned bundle has no constrained root: the test of their exclusion proves nothing; update it")
	}
	var got [][]byte
	for rest := pemBytes; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			if len(bytes.TrimSpace(rest)) != 0 {
				t.Fatalf("the bundle has %d bytes that are not PEM", len(rest))
			}
			break
		}
		if b.Type != "CERTIFICATE" || len(b.Headers) != 0 {
			t.Fatalf("a PEM block of type %q with headers %v", b.Type, b.Headers)
		}
		got = append(got, b.Bytes)
	}
	if n != len(want) || len(got) != len(want) {
		t.Fatalf("bundle reports %d roots and holds %d, want the %d unconstrained", n, len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("root %d differs from the NSS bundle's", i)
		}
	}
	for _, c := range constrained {
		if bytes.Contains(pemBytes, pemEncode(c)) {
			t.Fatal("a constrained root is in the bundle, trusted without its constraint")
		}
	}
}

func pemEncode(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestBuildRefusesBinaries(t *testing.T) {
	s := testSpec(t)
	good := mustRead(t, fixtures.good)

	_, err := Build(s, mustRead(t, fixtures.loose))
	want := strings.Join([]string{
		`binary was built with CGO_ENABLED="1", not "0"`,
		`binary was built with -trimpath="", not "true"`,
		`binary has no symbol table (linked with -s?), so github.com/compass-runner/identity/internal/lib/buildinfo.version cannot be read: no symbol section`,
		`binary has no symbol table (linked with -s?), so github.com/compass-runner/identity/internal/lib/buildinfo.revision cannot be read: no symbol section`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("loose binary: %v\nwant:\n%s", err, want)
	}

	other := s
	other.Version, other.Revision = "v0.2.0", strings.Repeat("f", 40)
	_, err = Build(other, good)
	want = `binary's linked version (-X github.com/compass-runner/identity/internal/lib/buildinfo.version) is "v0.1.0", not "v0.2.0"` + "\n" +
		`binary's linked revision (-X github.com/compass-runner/identity/internal/lib/buildinfo.revision) is "` + testRevision + `", not "ffffffffffffffffffffffffffffffffffffffff"`
	if err == nil || err.Error() != want {
		t.Fatalf("another version: %v\nwant:\n%s", err, want)
	}

	if _, err := Build(s, []byte("#!/bin/sh\necho hi\n")); err == nil || err.Error() != "binary is not an ELF file: bad magic number '[35 33 47 98]' in record at byte 0x0" {
		t.Fatalf("a script: %v", err)
	}

	wrongArch := s
	wrongArch.Arch = map[string]string{"amd64": "arm64", "arm64": "amd64"}[s.Arch]
	_, err = Build(wrongArch, good)
	machine := map[string]string{"amd64": "EM_X86_64", "arm64": "EM_AARCH64"}
	if want := fmt.Sprintf("binary is for %s (ELFCLASS64), not %s (%s)", machine[s.Arch], machine[wrongArch.Arch], wrongArch.Arch); err == nil || err.Error() != want {
		t.Fatalf("wrong arch: %v, want %q", err, want)
	}

	// The same binary with its first program header turned into PT_INTERP
	// is what a cgo build looks like to the loader: it needs a libc the
	// image does not have.
	dyn := slices.Clone(good)
	phoff := binary.LittleEndian.Uint64(dyn[0x20:])
	binary.LittleEndian.PutUint32(dyn[phoff:], 3) // PT_INTERP
	if _, err := Build(s, dyn); err == nil || err.Error() != "binary is dynamically linked (it names an ELF interpreter); the image has no libc: build with CGO_ENABLED=0" {
		t.Fatalf("dynamic binary: %v", err)
	}
}

func TestReadBinaryRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := readBinary(dir); err == nil || err.Error() != "binary "+dir+" is not a regular file" {
		t.Fatalf("directory: %v", err)
	}
	missing := filepath.Join(dir, "missing")
	if _, err := readBinary(missing); !errors.Is(err, fs.ErrNotExist) || err.Error() != "binary: open "+missing+": no such file or directory" {
		t.Fatalf("missing: %v", err)
	}
	big := filepath.Join(dir, "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(maxBinary + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	if _, err := readBinary(big); err == nil || err.Error() != fmt.Sprintf("binary %s is 536870913 bytes, over the 536870912-byte limit", big) {
		t.Fatalf("too big: %v", err)
	}
}

func TestWriteLayoutRefusesAnExistingDirectory(t *testing.T) {
	s := testSpec(t)
	img := built(t, s)
	dir := t.TempDir()
	if _, err := WriteLayout(dir, s, img); err == nil || err.Error() != "layout "+dir+" already exists; remove it first" {
		t.Fatalf("existing directory: %v", err)
	}
}

func TestSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"empty name", func(s *Spec) { s.Name = "" }, "name is empty"},
		{"upper-case name", func(s *Spec) { s.Name = "Compass" }, `name "Compass" is not lower-case letters and digits joined by single hyphens, at most 63 characters`},
		{"double hyphen", func(s *Spec) { s.Name = "compass--server" }, `name "compass--server" is not lower-case letters and digits joined by single hyphens, at most 63 characters`},
		{"long name", func(s *Spec) { s.Name = strings.Repeat("a", 64) }, `name "` + strings.Repeat("a", 64) + `" is not lower-case letters and digits joined by single hyphens, at most 63 characters`},
		{"version without v", func(s *Spec) { s.Version = "0.1.0" }, `version "0.1.0" is not a semantic version with a leading v and no build metadata (v1.2.3, v1.2.3-rc.1)`},
		{"version with build metadata", func(s *Spec) { s.Version = "v0.1.0+abc" }, `version "v0.1.0+abc" is not a semantic version with a leading v and no build metadata (v1.2.3, v1.2.3-rc.1)`},
		{"short revision", func(s *Spec) { s.Revision = "0123456" }, `revision "0123456" is not a full lower-case hex commit (40 or 64 digits)`},
		{"upper-case revision", func(s *Spec) { s.Revision = strings.ToUpper(testRevision) }, `revision "` + strings.ToUpper(testRevision) + `" is not a full lower-case hex commit (40 or 64 digits)`},
		{"http source", func(s *Spec) { s.Source = "http://github.com/compass-runner/identity" }, `source "http://github.com/compass-runner/identity" is not an https URL without credentials, query or fragment`},
		{"source with credentials", func(s *Spec) { s.Source = "https://user:pw@example.com/x" }, `source "https://user:pw@example.com/x" is not an https URL without credentials, query or fragment`},
		{"bad licenses", func(s *Spec) { s.Licenses = "Apache-2.0; rm -rf" }, `licenses "Apache-2.0; rm -rf" is not an SPDX expression of at most 256 characters`},
		{"bad arch", func(s *Spec) { s.Arch = "386" }, `arch "386" is not one of amd64, arm64`},
		{"subsecond time", func(s *Spec) { s.Created = s.Created.Add(time.Millisecond) }, "created 2025-12-01T14:40:00.001Z is not a whole second from 1970 to 9999"},
		{"before 1970", func(s *Spec) { s.Created = time.Unix(-1, 0) }, "created 1969-12-31T23:59:59Z is not a whole second from 1970 to 9999"},
		{"bad repository", func(s *Spec) { s.Repository = "ghcr.io/Compass" }, `repository "ghcr.io/Compass": repository can only contain the characters ` + "`abcdefghijklmnopqrstuvwxyz0123456789_-./`: Compass/compass-fake"},
		{"two errors", func(s *Spec) { s.Name, s.Arch = "", "386" }, "name is empty\n" + `arch "386" is not one of amd64, arm64`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec(t)
			tc.edit(&s)
			if err := s.Validate(); err == nil || err.Error() != tc.want {
				t.Fatalf("got %v\nwant %s", err, tc.want)
			}
		})
	}
	s := testSpec(t)
	s.Version = "v1.2.3-rc.1"
	if err := s.Validate(); err != nil {
		t.Fatalf("a pre-release version: %v", err)
	}
}
