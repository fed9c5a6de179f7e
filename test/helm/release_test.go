package helm

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// compassPrograms are the Compass images a release pins, by the chart's
// values key.
var compassPrograms = map[string]string{
	"runner":  "compass-runner",
	"callout": "compass-callout",
	"server":  "compass-server",
}

// releaseRegistry is where the test's made-up release pushed its images: a
// registry with a port, as the dry run's loopback one.
const releaseRegistry = "127.0.0.1:5000/compass-runner"

// chartNATSImage is the chart's NATS image as it renders without a digest
// (registry/repository:tag of values.yaml's nats.image, the registry left
// out when empty): what images.env's NATS_IMAGE names.
func chartNATSImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ChartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		NATS struct {
			Image struct{ Registry, Repository, Tag string }
		}
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	img := v.NATS.Image
	if img.Repository == "" || img.Tag == "" {
		t.Fatalf("values.yaml's nats.image has no repository or tag: %+v", img)
	}
	ref := img.Repository + ":" + img.Tag
	if img.Registry != "" {
		ref = img.Registry + "/" + ref
	}
	return ref
}

// fakeRelease writes an images.env as .ci/release writes it, each image at
// a digest made from its name and seed, and returns it with the reference
// each image must be rendered as: a Compass image tagged with version, the
// NATS image (key nats) with the chart's own tag, each pinned by digest.
func fakeRelease(t *testing.T, dir, version, seed string) (env string, refs map[string]string) {
	t.Helper()
	refs = map[string]string{}
	var b strings.Builder
	for key, program := range compassPrograms {
		digest := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(program+" "+seed)))
		fmt.Fprintf(&b, "%s_IMAGE=%s/%s@%s\n", strings.ToUpper(key), releaseRegistry, program, digest)
		refs[key] = releaseRegistry + "/" + program + ":" + version + "@" + digest
	}
	refs["nats"] = chartNATSImage(t) + "@" + fmt.Sprintf("sha256:%x", sha256.Sum256([]byte("nats "+seed)))
	fmt.Fprintf(&b, "NATS_IMAGE=%s\n", refs["nats"])
	env = filepath.Join(dir, "images.env")
	if err := os.WriteFile(env, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return env, refs
}

// releaseChart runs .ci/release-chart on the repository's chart and
// returns what it printed and its error.
func releaseChart(t *testing.T, env, out, version string) ([]byte, error) {
	t.Helper()
	root := RepoRoot(t)
	cmd := exec.CommandContext(t.Context(), "bash", filepath.Join(root, ".ci", "release-chart"),
		"--images-env", env, "--out", out, "--chart", ChartDir(t), "--version", version)
	cmd.Dir = root
	return cmd.CombinedOutput()
}

// podImages are the images of every container, init container and
// ephemeral container in the objects, sorted, each once.
func podImages(objs []object) []string {
	var images []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "containers" || k == "initContainers" || k == "ephemeralContainers" {
					for _, c := range asSlice(x) {
						if m, ok := c.(map[string]any); ok {
							images = append(images, fmt.Sprint(m["image"]))
						}
					}
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	for _, o := range objs {
		walk(o.value)
	}
	slices.Sort(images)
	return slices.Compact(images)
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// TestReleaseChartRunsEachCompassImageByDigest: the chart .ci/release-chart
// packages from an images.env runs each Compass image by that file's digest,
// tagged with the version, wherever the chart runs it (the Runner, the
// callout, the Server and its init containers, the backup CronJob, the
// migrate Job) and no Compass image otherwise: with only clusterName and
// serverURL set, exactly the Runner's and the callout's. The in-cluster
// nats-server (and its reloader) runs the chart's NATS image by
// NATS_IMAGE's digest, with the chart's own tag. The values-images.yaml
// written beside it pins the same images over the repository's own chart,
// and the package's Chart.yaml carries VERSION.
func TestReleaseChartRunsEachCompassImageByDigest(t *testing.T) {
	bin := Binary(t)
	raw, err := os.ReadFile(filepath.Join(RepoRoot(t), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(raw))
	dir := t.TempDir()
	env, refs := fakeRelease(t, dir, version, t.Name())
	out := filepath.Join(dir, "release")
	if b, err := releaseChart(t, env, out, version); err != nil {
		t.Fatalf(".ci/release-chart: %v\n%s", err, b)
	}
	tgz := filepath.Join(out, "compass-"+strings.TrimPrefix(version, "v")+".tgz")

	r := Run(t, bin, "show", "chart", tgz)
	if r.Err != nil {
		t.Fatalf("helm show chart: %v: %s", r.Err, r.Stderr)
	}
	var meta struct{ Name, Version, AppVersion string }
	if err := yaml.Unmarshal(r.Stdout, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Name != "compass" || meta.Version != strings.TrimPrefix(version, "v") || meta.AppVersion != version {
		t.Fatalf("the package's Chart.yaml: %+v, want compass %s, appVersion %s", meta, strings.TrimPrefix(version, "v"), version)
	}

	required := []string{"--set", "clusterName=release-check", "--set", "serverURL=https://compass.example.com:8443"}
	want := func(keys ...string) []string {
		var w []string
		for _, k := range keys {
			w = append(w, refs[k])
		}
		slices.Sort(w)
		return w
	}
	for _, tc := range []struct {
		name  string
		chart string
		args  []string
		want  []string
	}{
		{"only clusterName and serverURL", tgz, nil, want("runner", "callout")},
		{"the Server on SQLite", tgz, []string{"--set", "server.enabled=true"}, want("runner", "callout", "server")},
		{"the Server on PostgreSQL", tgz, []string{"--set", "server.enabled=true", "--set", "server.databaseSecret=compass-db", "--set", "networkPolicies.databaseCIDR=10.20.0.0/16"}, want("runner", "callout", "server")},
		{"the backup CronJob alone", tgz, []string{"--set", "server.enabled=true", "--set", "server.backup.schedule=0 3 * * *", "--set", "server.backup.claim=compass-backup", "--show-only", "templates/server-backup-cronjob.yaml"}, want("server")},
		{"the migrate Job alone", tgz, []string{"--set", "server.enabled=true", "--set", "server.migrateJob=true", "--show-only", "templates/server-migrate-job.yaml"}, want("server")},
		{"the in-cluster nats-server", tgz, []string{"--set", "nats.enabled=true"}, want("runner", "callout", "nats")},
		{"a nats-server cluster and the Server", tgz, []string{"--set", "nats.enabled=true", "--set", "nats.cluster=true", "--set", "server.enabled=true"}, want("runner", "callout", "server", "nats")},
		{"values-images.yaml over the repository's chart", ChartDir(t), []string{"-f", filepath.Join(out, "values-images.yaml"), "--set", "server.enabled=true", "--set", "nats.enabled=true"}, want("runner", "callout", "server", "nats")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", Release, tc.chart, "--namespace", Namespace}, required...)
			r := Run(t, bin, append(args, tc.args...)...)
			if r.Err != nil {
				t.Fatalf("helm template: %v: %s", r.Err, r.Stderr)
			}
			objs, err := decodeObjects(r.Stdout)
			if err != nil {
				t.Fatal(err)
			}
			if got := podImages(objs); !slices.Equal(got, tc.want) {
				t.Fatalf("the rendering runs\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// TestReleaseChartRefusesAnotherVersionOrAnImageByTag: .ci/release-chart
// packages nothing when the chart is not VERSION's, images.env names an
// image by tag, or its NATS_IMAGE is not the chart's NATS image, and says
// why.
func TestReleaseChartRefusesAnotherVersionOrAnImageByTag(t *testing.T) {
	Binary(t)
	raw, err := os.ReadFile(filepath.Join(RepoRoot(t), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(raw))
	nats := chartNATSImage(t)
	// replace sets the line of images.env's variable v to line.
	replace := func(v, line string) func(string) string {
		return func(s string) string {
			lines := strings.Split(s, "\n")
			for i, l := range lines {
				if strings.HasPrefix(l, v+"=") {
					lines[i] = line
				}
			}
			return strings.Join(lines, "\n")
		}
	}
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(t.Name())))
	for _, tc := range []struct {
		name    string
		version string
		env     func(string) string
		want    string
	}{
		{"a chart of another version", "v9.9.9", func(s string) string { return s },
			`version is "` + strings.TrimPrefix(version, "v") + `", not 9.9.9`},
		{"the Runner's image by tag", version, replace("RUNNER_IMAGE", "RUNNER_IMAGE="+releaseRegistry+"/compass-runner:"+version),
			"RUNNER_IMAGE: \"" + releaseRegistry + "/compass-runner:" + version + "\" is not pinned by a sha256 digest"},
		{"the NATS image by tag", version, replace("NATS_IMAGE", "NATS_IMAGE="+nats),
			"NATS_IMAGE: \"" + nats + "\" is not pinned by a sha256 digest"},
		{"no NATS image", version, replace("NATS_IMAGE", ""), "NATS_IMAGE is missing"},
		{"a NATS image not the chart's", version, replace("NATS_IMAGE", "NATS_IMAGE=nats:latest@"+digest),
			"images.env's NATS_IMAGE names nats:latest, not the chart's nats.image " + nats + ": the release pins the chart's own image by digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env, _ := fakeRelease(t, dir, version, t.Name())
			b, err := os.ReadFile(env)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(env, []byte(tc.env(string(b))), 0o600); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "release")
			got, err := releaseChart(t, env, out, tc.version)
			if err == nil || !strings.Contains(string(got), tc.want) {
				t.Fatalf(".ci/release-chart: %v\n%s\nwant a refusal with %q", err, got, tc.want)
			}
			if left, _ := filepath.Glob(filepath.Join(out, "*")); len(left) != 0 {
				t.Fatalf("a refused packaging left %v", left)
			}
		})
	}
}
