package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// sbomDoc is a CycloneDX document shaped as cyclonedx-gomod bin -json
// -noserial -notimestamp writes it for s's program on arch; edit changes it
// before it is encoded.
func sbomDoc(t *testing.T, s Spec, arch string, edit func(map[string]any)) []byte {
	t.Helper()
	doc := map[string]any{
		"bomFormat":   "CycloneDX",
		"specVersion": "1.6",
		"version":     1,
		"metadata": map[string]any{
			"component": map[string]any{
				"type":    "application",
				"name":    mainModule,
				"version": s.Version,
				"purl":    "pkg:golang/" + mainModule + "@" + s.Version + "?goarch=" + arch + "&goos=linux&type=module#cmd/" + s.Name,
			},
		},
		"components": []any{map[string]any{"type": "library", "name": "github.com/nats-io/nats.go", "version": "v1.50.0"}},
	}
	if edit != nil {
		edit(doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// platforms are the images of both arches' fixtures for s, with their SBOMs.
func platforms(t *testing.T, s Spec) []PlatformImage {
	t.Helper()
	var out []PlatformImage
	for _, p := range []struct{ arch, bin string }{{runtime.GOARCH, fixtures.good}, {otherArch(), fixtures.other}} {
		ps := s
		ps.Arch = p.arch
		img, err := Build(ps, mustRead(t, p.bin))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, PlatformImage{Arch: p.arch, Image: img, SBOM: sbomDoc(t, s, p.arch, nil)})
	}
	return out
}

// writeIndex writes the index of plats for s into a new layout and returns
// its directory.
func writeIndex(t *testing.T, s Spec, plats []PlatformImage) string {
	t.Helper()
	idx, arts, err := BuildIndex(s, plats)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "index")
	if _, err := WriteIndexLayout(dir, s, idx, arts); err != nil {
		t.Fatal(err)
	}
	return dir
}

func bothArches() []string { return []string{runtime.GOARCH, otherArch()} }

func TestIndexHoldsEachPlatformAndItsSBOM(t *testing.T) {
	s := testSpec(t)
	plats := platforms(t, s)
	dir := writeIndex(t, s, plats)

	want := map[string]v1.Image{}
	for _, p := range plats {
		want[p.Arch] = p.Image
	}
	rep, err := CheckIndex(dir, s, bothArches(), want)
	if err != nil {
		t.Fatalf("CheckIndex: %v", err)
	}
	for _, p := range plats {
		d, err := p.Image.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Images[p.Arch] != d {
			t.Errorf("%s: the index holds %s, want the image %s", p.Arch, rep.Images[p.Arch], d)
		}
		if rep.SBOMSize[p.Arch] != len(p.SBOM) {
			t.Errorf("%s: SBOM of %d bytes, want %d", p.Arch, rep.SBOMSize[p.Arch], len(p.SBOM))
		}
	}

	// Reproducible: a second layout of the same inputs is byte-identical.
	again := writeIndex(t, s, platforms(t, s))
	fa, fb := layoutFiles(t, dir), layoutFiles(t, again)
	if len(fa) != len(fb) {
		t.Fatalf("two builds wrote %d and %d files", len(fa), len(fb))
	}
	for name, b := range fa {
		if !bytes.Equal(b, fb[name]) {
			t.Errorf("%s differs between two builds of the same inputs", name)
		}
	}
}

func TestCheckIndexCatches(t *testing.T) {
	s := testSpec(t)
	cases := []struct {
		name   string
		arches []string
		make   func(t *testing.T) string
		want   string
	}{{
		name:   "a platform missing",
		arches: bothArches(),
		make:   func(t *testing.T) string { return writeIndex(t, s, platforms(t, s)[:1]) },
		want:   "the index's platforms are [" + runtime.GOARCH + "], not [" + runtime.GOARCH + " " + otherArch() + "]",
	}, {
		name:   "an SBOM missing",
		arches: bothArches(),
		make: func(t *testing.T) string {
			idx, arts, err := BuildIndex(s, platforms(t, s))
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "index")
			if _, err := WriteIndexLayout(dir, s, idx, arts[:1]); err != nil {
				t.Fatal(err)
			}
			return dir
		},
		want: "no SBOM for the " + otherArch() + " image",
	}, {
		name:   "checked as another version",
		arches: bothArches(),
		make:   func(t *testing.T) string { return writeIndex(t, s, platforms(t, s)) },
		want:   "index entry annotations are map[" + annRefName + ":" + s.Ref() + "], not " + annRefName + "=" + strings.Replace(s.Ref(), testVersion, "v0.2.0", 1),
	}, {
		name:   "checked for one platform only",
		arches: []string{runtime.GOARCH},
		make:   func(t *testing.T) string { return writeIndex(t, s, platforms(t, s)) },
		want:   "the index's platforms are [" + runtime.GOARCH + " " + otherArch() + "], not [" + runtime.GOARCH + "]",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.make(t)
			check := s
			if tc.name == "checked as another version" {
				check.Version = "v0.2.0"
			}
			_, err := CheckIndex(dir, check, tc.arches, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckIndex = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestBuildIndexRefusesBadSBOMs(t *testing.T) {
	s := testSpec(t)
	other := otherArch()
	cases := []struct {
		name string
		edit func(p []PlatformImage)
		want string
	}{{
		name: "not JSON",
		edit: func(p []PlatformImage) { p[1].SBOM = []byte("<bom/>") },
		want: "sbom for " + other + " is not JSON",
	}, {
		name: "not CycloneDX",
		edit: func(p []PlatformImage) {
			p[1].SBOM = sbomDoc(t, s, other, func(d map[string]any) { d["bomFormat"] = "SPDX" })
		},
		want: `sbom for ` + other + `: bomFormat is "SPDX", not CycloneDX`,
	}, {
		name: "another arch's SBOM",
		edit: func(p []PlatformImage) { p[1].SBOM = sbomDoc(t, s, runtime.GOARCH, nil) },
		want: "is not cmd/" + testName + " for goarch=" + other,
	}, {
		name: "another version",
		edit: func(p []PlatformImage) {
			o := s
			o.Version = "v9.9.9"
			p[1].SBOM = sbomDoc(t, o, other, nil)
		},
		want: "sbom for " + other + " describes " + mainModule + "@v9.9.9, not " + mainModule + "@" + testVersion,
	}, {
		name: "a serial number",
		edit: func(p []PlatformImage) {
			p[1].SBOM = sbomDoc(t, s, other, func(d map[string]any) { d["serialNumber"] = "urn:uuid:1" })
		},
		want: "sbom for " + other + " has a serial number or timestamp; it must be reproducible",
	}, {
		name: "a timestamp",
		edit: func(p []PlatformImage) {
			p[1].SBOM = sbomDoc(t, s, other, func(d map[string]any) {
				d["metadata"].(map[string]any)["timestamp"] = "2026-12-03T00:00:00Z"
			})
		},
		want: "sbom for " + other + " has a serial number or timestamp; it must be reproducible",
	}, {
		name: "no components",
		edit: func(p []PlatformImage) {
			p[1].SBOM = sbomDoc(t, s, other, func(d map[string]any) { delete(d, "components") })
		},
		want: "sbom for " + other + " lists no components",
	}, {
		name: "one arch twice",
		edit: func(p []PlatformImage) { p[1].Arch = p[0].Arch },
		want: "index: two images for " + runtime.GOARCH,
	}, {
		name: "an image of the other arch",
		edit: func(p []PlatformImage) { p[1].Image = p[0].Image },
		want: "index: the image given for " + other + " is linux/" + runtime.GOARCH,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := platforms(t, s)
			tc.edit(p)
			_, _, err := BuildIndex(s, p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("BuildIndex = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// The release procedure's dry run: index, check-index and push through the
// command line, to a registry on loopback (go-containerregistry's, with the
// referrers API): the registry serves the index under the tag with the
// layout's digest, both platforms, and each image's SBOM as its referrer.
func TestCLIIndexCheckAndPushToARegistry(t *testing.T) {
	s := testSpec(t)
	work := t.TempDir()
	var indexArgs, checkArgs []string
	for _, p := range []struct{ arch, bin string }{{runtime.GOARCH, fixtures.good}, {otherArch(), fixtures.other}} {
		ps := s
		ps.Arch = p.arch
		dir := filepath.Join(work, p.arch)
		if _, err := WriteLayout(dir, ps, mustBuild(t, ps, p.bin)); err != nil {
			t.Fatal(err)
		}
		sbom := filepath.Join(work, p.arch+".cdx.json")
		if err := os.WriteFile(sbom, sbomDoc(t, s, p.arch, nil), 0o644); err != nil {
			t.Fatal(err)
		}
		indexArgs = append(indexArgs, "--image", p.arch+"="+dir, "--sbom", p.arch+"="+sbom)
		checkArgs = append(checkArgs, "--image", p.arch+"="+dir)
	}
	out := filepath.Join(work, "index")
	code, stdout, stderr := runCLI(t, append(append([]string{"index", "--out", out}, indexArgs...), specArgs()...)...)
	if code != 0 {
		t.Fatalf("index exited %d: %s", code, stderr)
	}
	fields := strings.Fields(stdout)
	if len(fields) != 3 || fields[0] != testName || fields[1] != s.Ref() || !strings.HasPrefix(fields[2], "sha256:") {
		t.Fatalf("index printed %q, want %q <digest>", stdout, testName+" "+s.Ref())
	}
	digest := fields[2]

	sbomOut := t.TempDir()
	code, stdout, stderr = runCLI(t, append(append([]string{"check-index", "--layout", out, "--arches", strings.Join(bothArches(), ","), "--sbom-out", sbomOut}, checkArgs...), specArgs()...)...)
	if code != 0 {
		t.Fatalf("check-index exited %d: %s", code, stderr)
	}
	for _, arch := range bothArches() {
		got := mustRead(t, filepath.Join(sbomOut, testName+"-"+testVersion+"-linux-"+arch+".cdx.json"))
		if !bytes.Equal(got, sbomDoc(t, s, arch, nil)) {
			t.Errorf("check-index --sbom-out wrote another %s SBOM than the one indexed", arch)
		}
	}
	if !strings.HasPrefix(stdout, s.Ref()+" "+digest+" (image index)\n") || strings.Count(stdout, "sbom sha256:") != 2 {
		t.Fatalf("check-index printed:\n%s", stdout)
	}

	srv := httptest.NewServer(registry.New(registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	to := host + "/compass-runner/" + testName + ":" + testVersion
	code, stdout, stderr = runCLI(t, "push", "--layout", out, "--to", to, "--insecure")
	if code != 0 {
		t.Fatalf("push exited %d: %s", code, stderr)
	}
	if stdout != to+" "+digest+"\n" {
		t.Fatalf("push printed %q, want %q", stdout, to+" "+digest+"\n")
	}

	tag, err := name.NewTag(to, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := idx.Digest(); err != nil || d.String() != digest {
		t.Fatalf("the registry's %s is %v (%v), want %s", to, d, err, digest)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 2 {
		t.Fatalf("the pushed index has %d manifests, want 2", len(im.Manifests))
	}
	for _, m := range im.Manifests {
		refs, err := remote.Referrers(tag.Context().Digest(m.Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		rm, err := refs.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(rm.Manifests) != 1 {
			t.Fatalf("referrers of the %s image: %+v, want one SBOM", m.Platform.Architecture, rm.Manifests)
		}
		// The artifact's own manifest, not the registry's summary: this
		// registry summarizes artifactType from config.mediaType (an early
		// OCI 1.1 draft) where the spec takes the manifest's artifactType.
		art, err := remote.Image(tag.Context().Digest(rm.Manifests[0].Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		am, err := art.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if am.ArtifactType != string(sbomType) || am.Subject == nil || am.Subject.Digest != m.Digest {
			t.Errorf("the %s image's referrer has artifactType %q and subject %v, want %s and the image %s",
				m.Platform.Architecture, am.ArtifactType, am.Subject, sbomType, m.Digest)
		}
	}

	// The pushed bytes are the layout's: the registry's copy of the first
	// SBOM artifact equals the layout's.
	lp, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	lidx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	lm, err := lidx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range lm.Manifests[1:] {
		img, err := remote.Image(tag.Context().Digest(d.Digest.String()))
		if err != nil {
			t.Fatalf("the registry has no SBOM artifact %s: %v", d.Digest, err)
		}
		if got, err := img.Digest(); err != nil || got != d.Digest {
			t.Fatalf("SBOM artifact %s came back as %v (%v)", d.Digest, got, err)
		}
	}
}

func TestCLIIndexAndPushUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"index without --out", append([]string{"index", "--image", "amd64=x", "--sbom", "amd64=y"}, specArgs()...), "--out and at least one --image are required"},
		{"index with SBOMs of other arches", append([]string{"index", "--out", "o", "--image", "amd64=x", "--sbom", "arm64=y"}, specArgs()...), "--sbom must name the arches of --image, in the same order ([amd64], not [arm64])"},
		{"index with an unknown arch", append([]string{"index", "--out", "o", "--image", "riscv64=x"}, specArgs()...), `"riscv64=x" is not ARCH=PATH with ARCH amd64 or arm64`},
		{"index with one arch twice", append([]string{"index", "--out", "o", "--image", "amd64=x", "--image", "amd64=y"}, specArgs()...), "amd64 is given twice"},
		{"push without --to", []string{"push", "--layout", "x"}, "--layout and --to are required"},
		{"push to a digest", []string{"push", "--layout", "x", "--to", "ghcr.io/compass-runner/x@sha256:" + strings.Repeat("0", 64)}, `--to "ghcr.io/compass-runner/x@sha256:`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}

func mustBuild(t *testing.T, s Spec, bin string) v1.Image {
	t.Helper()
	img, err := Build(s, mustRead(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestRegistryRefusesANonLoopbackAddress(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:5000", "localhost:0"} {
		err := serveRegistry(t.Context(), addr, func(string) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "is not a loopback address") {
			t.Errorf("serveRegistry(%q) = %v, want a refusal", addr, err)
		}
	}
}

func TestRegistryServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveRegistry(ctx, "127.0.0.1:0", func(addr string) error { addrc <- addr; return nil })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("serveRegistry = %v before serving", err)
	}
	res, err := http.Get("http://" + addr + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v2/ = %d", res.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serveRegistry after cancel = %v", err)
	}
}
