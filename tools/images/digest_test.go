package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// startRegistry serves the dry run's in-memory registry (serveRegistry) on
// loopback until the test ends, and returns its address.
func startRegistry(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveRegistry(ctx, "127.0.0.1:0", func(addr string) error { addrc <- addr; return nil })
	}()
	t.Cleanup(func() {
		// The client's pooled connections first: one dialled and never
		// used holds the server's graceful shutdown for 5 s (net/http
		// counts a new connection as idle only after that long).
		if tr, ok := remote.DefaultTransport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveRegistry: %v", err)
		}
	})
	select {
	case addr := <-addrc:
		return addr
	case err := <-done:
		t.Fatalf("serveRegistry = %v before serving", err)
		return ""
	}
}

// testIndex is a two-platform image index of the test binaries, as images
// index makes one, and the image of this machine's platform in it.
func testIndex(t *testing.T) (v1.ImageIndex, v1.Image) {
	t.Helper()
	s := testSpec(t)
	var plats []PlatformImage
	for _, p := range []struct{ arch, bin string }{{runtime.GOARCH, fixtures.good}, {otherArch(), fixtures.other}} {
		ps := s
		ps.Arch = p.arch
		plats = append(plats, PlatformImage{Arch: p.arch, Image: mustBuild(t, ps, p.bin), SBOM: sbomDoc(t, s, p.arch, nil)})
	}
	idx, _, err := BuildIndex(s, plats)
	if err != nil {
		t.Fatal(err)
	}
	return idx, plats[0].Image
}

func mustDigest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// TestCLIDigestPrintsWhatTheRegistryServes: digest prints the digest the
// registry serves for a tag (an image index's, or an image manifest's where
// the tag names one image) or confirms a digest it holds; a tag it does not
// hold, or a digest it does not, fails naming the reference.
func TestCLIDigestPrintsWhatTheRegistryServes(t *testing.T) {
	addr := startRegistry(t)
	idx, img := testIndex(t)
	index := addr + "/library/nats:2.15.2-alpine"
	single := addr + "/library/nats:single"
	for ref, write := range map[string]func(name.Tag) error{
		index:  func(tag name.Tag) error { return remote.WriteIndex(tag, idx) },
		single: func(tag name.Tag) error { return remote.Write(tag, img) },
	} {
		tag, err := name.NewTag(ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := write(tag); err != nil {
			t.Fatal(err)
		}
	}
	indexDigest, imageDigest := mustDigest(t, idx), mustDigest(t, img)
	absent := "sha256:" + strings.Repeat("0", 64)
	for _, tc := range []struct {
		name, ref string
		code      int
		stdout    string
		stderr    string
	}{
		{"an image index", index, 0, indexDigest + "\n", ""},
		{"an image", single, 0, imageDigest + "\n", ""},
		{"by its digest", addr + "/library/nats@" + indexDigest, 0, indexDigest + "\n", ""},
		{"a tag the registry does not hold", addr + "/library/nats:2.14.0-alpine", 1, "",
			"images: digest: " + addr + "/library/nats:2.14.0-alpine: GET http://" + addr + "/v2/library/nats/manifests/2.14.0-alpine: MANIFEST_UNKNOWN: Unknown manifest\n"},
		{"a digest the registry does not hold", addr + "/library/nats@" + absent, 1, "",
			"images: digest: " + addr + "/library/nats@" + absent + ": GET http://" + addr + "/v2/library/nats/manifests/" + absent + ": MANIFEST_UNKNOWN: Unknown manifest\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "digest", "--ref", tc.ref, "--insecure")
			if code != tc.code || stdout != tc.stdout || stderr != tc.stderr {
				t.Fatalf("digest --ref %s: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.ref, code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

// TestDigestAsksWithAGetWhereHEADIsRefused: a registry that answers no
// HEAD of a manifest is asked with a GET, and the digest is the same; what
// is neither an image index nor an image is refused.
func TestDigestAsksWithAGetWhereHEADIsRefused(t *testing.T) {
	var refuseHead atomic.Bool
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuseHead.Load() && r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/manifests/") {
			http.Error(w, "no HEAD here", http.StatusMethodNotAllowed)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	idx, _ := testIndex(t)
	tag, err := name.NewTag(host+"/library/nats:2.15.2-alpine", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	// A manifest of a media type no image has, put as it is.
	other, err := name.NewTag(host+"/library/nats:other", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPut, srv.URL+"/v2/library/nats/manifests/other", bytes.NewReader([]byte(`{"schemaVersion": 2}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/vnd.example.thing+json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("PUT of the other manifest: %s", res.Status)
	}

	refuseHead.Store(true)
	got, err := Digest(tag)
	if err != nil || got.String() != mustDigest(t, idx) {
		t.Fatalf("Digest(%s) without HEAD = %v, %v, want %s", tag, got, err, mustDigest(t, idx))
	}
	for _, head := range []bool{true, false} {
		refuseHead.Store(!head)
		_, err := Digest(other)
		if want := "digest: " + other.String() + " is a application/vnd.example.thing+json, not an image index or an image manifest"; err == nil || err.Error() != want {
			t.Fatalf("Digest(%s), HEAD answered %v: %v, want %s", other, head, err, want)
		}
	}
}

func TestCLIDigestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no reference", []string{"digest"}, "images: --ref is required\n"},
		{"no registry", []string{"digest", "--ref", "nats:2.15.2-alpine"},
			`images: --ref "nats:2.15.2-alpine": could not parse reference: nats:2.15.2-alpine (name the registry, the whole repository path and a tag or digest: docker.io/library/nats:2.15.2-alpine)` + "\n"},
		{"no library path", []string{"digest", "--ref", "docker.io/nats:2.15.2-alpine"},
			`images: --ref "docker.io/nats:2.15.2-alpine": could not parse reference: docker.io/nats:2.15.2-alpine (name the registry, the whole repository path and a tag or digest: docker.io/library/nats:2.15.2-alpine)` + "\n"},
		{"an argument", []string{"digest", "--ref", "docker.io/library/nats:2.15.2-alpine", "more"}, `images: unexpected arguments ["more"]` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			if want := tc.want + usage + "\n"; code != 2 || stdout != "" || stderr != want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2 and %q", code, stdout, stderr, want)
			}
		})
	}
}
