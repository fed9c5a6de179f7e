package deploy

import (
	"os"
	"strings"
	"testing"
)

// The manifests' default images carry the version the images are built and
// tagged with: the first line of VERSION, which .ci/images reads.
func TestImageVersionIsVERSION(t *testing.T) {
	data, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	version, _, _ := strings.Cut(string(data), "\n")
	if version = strings.TrimSpace(version); version != ImageVersion {
		t.Fatalf("deploy.ImageVersion = %q, VERSION says %q", ImageVersion, version)
	}
	p := DefaultParams()
	for _, img := range []string{p.RunnerImage, p.CalloutImage} {
		if !strings.HasPrefix(img, ImageRepository+"/") || !strings.HasSuffix(img, ":"+version) {
			t.Errorf("default image %s is not %s/<name>:%s", img, ImageRepository, version)
		}
	}
	committed, err := os.ReadFile("kubernetes/compass-runner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(committed), `image: "`+ImageRepository+"/compass-runner:"+version+`"`) {
		t.Errorf("deploy/kubernetes/compass-runner.yaml does not run %s/compass-runner:%s", ImageRepository, version)
	}
}
