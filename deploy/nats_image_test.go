package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/compass-runner/identity/deploy"
)

// The nats-server the guide installs is the one the tests run: NATSImage and
// every nats image named in the documentation carry the version go.mod pins
// for github.com/nats-io/nats-server/v2, which the real-binary tests build
// (.ci/tools.sh) and the in-process tests link.
func TestNATSImageIsTheTestedVersion(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\d+\.\d+\.\d+)\s*$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod requires no github.com/nats-io/nats-server/v2")
	}
	version := string(m[1])
	if want := "nats:" + version + "-alpine"; deploy.NATSImage != want {
		t.Fatalf("deploy.NATSImage = %s, want %s (go.mod's nats-server)", deploy.NATSImage, want)
	}
	image := regexp.MustCompile(`\bnats:(\d+\.\d+\.\d+)(-[a-z0-9]+)?\b`)
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../README.md", "nats/README.md")
	named := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range image.FindAllSubmatch(b, -1) {
			named++
			if string(m[1]) != version {
				t.Errorf("%s names %s; the tests run nats-server %s (go.mod)", f, m[0], version)
			}
		}
	}
	if named == 0 || !strings.Contains(string(mustRead(t, "../docs/self-host.md")), deploy.NATSImage) {
		t.Fatalf("docs/self-host.md does not name %s", deploy.NATSImage)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
