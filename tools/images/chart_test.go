package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// chartDir is the chart the release packages. .ci/images runs these tests
// in a copy of the whole commit, so the path holds there too.
var chartDir = filepath.Join("..", "..", "deploy", "chart", "compass")

// testRegistry is where the test's images are: a loopback registry with a
// port, as in the dry run, so the pinned values hold a colon.
const testRegistry = "127.0.0.1:5000/compass-runner"

// fakeDigest is a digest made from seed: well formed, and different for
// every seed.
func fakeDigest(seed string) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(seed)))
}

// chartNATS is the repository's chart's NATS image (nats.image), which
// images.env's NATS_IMAGE must name: registry, repository and tag.
func chartNATS(t *testing.T) PinnedImage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	p, err := ChartImage(v, "nats")
	if err != nil {
		t.Fatalf("deploy/chart/compass/values.yaml: %v", err)
	}
	return p
}

// testPins are the three Compass images and the chart's NATS image at fake
// digests, in chartImages' order.
func testPins(t *testing.T) []PinnedImage {
	t.Helper()
	var pins []PinnedImage
	for _, c := range chartImages {
		if c.Program == "" {
			continue
		}
		pins = append(pins, PinnedImage{Key: c.Key, Registry: testRegistry, Repository: c.Program, Digest: fakeDigest(c.Program)})
	}
	nats := chartNATS(t)
	nats.Digest = fakeDigest("nats")
	return append(pins, nats)
}

// envLine is p's line of images.env, as .ci/release writes it: a Compass
// image as <registry>/<program>@<digest>, the NATS image as the chart names
// it, then @<digest>.
func envLine(p PinnedImage) string {
	if p.chartsOwn() {
		return imageVar(p.Key) + "=" + p.Ref("") + "\n"
	}
	return fmt.Sprintf("%s=%s/%s@%s\n", imageVar(p.Key), p.Registry, p.Repository, p.Digest)
}

// imagesEnv is images.env for pins, in the order given.
func imagesEnv(pins []PinnedImage) string {
	var b strings.Builder
	for _, p := range pins {
		b.WriteString(envLine(p))
	}
	return b.String()
}

func TestImagesEnvHoldsEachImageOnceByDigest(t *testing.T) {
	pins := testPins(t)
	good := imagesEnv(pins)
	// The order .ci/release writes (.ci/images' digests file: server first,
	// then the NATS image).
	reversed := imagesEnv([]PinnedImage{pins[2], pins[1], pins[0], pins[3]})
	got, err := ParseImagesEnv([]byte("\n" + reversed + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(pins) {
		t.Fatalf("ParseImagesEnv = %v, want %v", got, pins)
	}
	// A NATS image with a registry, its port and a path: all before the
	// last slash is the registry, as compass-server manifests --nats-image
	// splits it.
	mirrored := PinnedImage{Key: "nats", Registry: "127.0.0.1:5000/mirror/library", Repository: "nats", Tag: "2.15.2-alpine", Digest: pins[3].Digest}
	got, err = ParseImagesEnv([]byte(imagesEnv(append(pins[:3:3], mirrored))))
	if err != nil || got[3] != mirrored {
		t.Fatalf("ParseImagesEnv of %s = %v, %v, want %v", envLine(mirrored), got, err, mirrored)
	}

	runnerLine := strings.SplitN(good, "\n", 2)[0]
	rest := strings.TrimPrefix(good, runnerLine+"\n")
	compass := imagesEnv(pins[:3])
	d := pins[0].Digest
	nats := pins[3].Name("")
	// A line that does not parse leaves its variable missing too.
	for _, tc := range []struct{ name, env, want string }{
		{"a variable missing", rest, "RUNNER_IMAGE is missing"},
		{"a variable twice", good + runnerLine + "\n", "line 5: RUNNER_IMAGE is given twice"},
		{"an unknown variable", good + "POSTGRES_IMAGE=postgres@" + d + "\n", `line 5: "POSTGRES_IMAGE" is not one of RUNNER_IMAGE, CALLOUT_IMAGE, SERVER_IMAGE and NATS_IMAGE`},
		{"a line without =", good + "RUNNER_IMAGE\n", "line 5 is not VAR=REFERENCE"},
		{"a tag instead of a digest", "RUNNER_IMAGE=" + testRegistry + "/compass-runner:v0.1.0\n" + rest,
			`line 1: RUNNER_IMAGE: "` + testRegistry + `/compass-runner:v0.1.0" is not pinned by a sha256 digest (<registry>/compass-runner@sha256:<64 hex>)` + "\nRUNNER_IMAGE is missing"},
		{"a tag and a digest", "RUNNER_IMAGE=" + testRegistry + "/compass-runner:v0.1.0@" + d + "\n" + rest,
			`line 1: RUNNER_IMAGE: "` + testRegistry + `/compass-runner:v0.1.0@` + d + `" is not <registry>/compass-runner@<digest>` + "\nRUNNER_IMAGE is missing"},
		{"another program", "RUNNER_IMAGE=" + testRegistry + "/compass-callout@" + d + "\n" + rest,
			`line 1: RUNNER_IMAGE: "` + testRegistry + `/compass-callout@` + d + `" is not <registry>/compass-runner@<digest>` + "\nRUNNER_IMAGE is missing"},
		{"no registry", "RUNNER_IMAGE=compass-runner@" + d + "\n" + rest, `line 1: RUNNER_IMAGE: "compass-runner@` + d + `" is not <registry>/compass-runner@<digest>` + "\nRUNNER_IMAGE is missing"},
		{"a short digest", "RUNNER_IMAGE=" + testRegistry + "/compass-runner@" + d[:len(d)-1] + "\n" + rest,
			`line 1: RUNNER_IMAGE: "` + testRegistry + `/compass-runner@` + d[:len(d)-1] + `" is not pinned by a sha256 digest (<registry>/compass-runner@sha256:<64 hex>)` + "\nRUNNER_IMAGE is missing"},
		{"upper-case hex", "RUNNER_IMAGE=" + testRegistry + "/compass-runner@" + strings.ToUpper(d[:7]) + d[7:] + "\n" + rest,
			`line 1: RUNNER_IMAGE: "` + testRegistry + `/compass-runner@SHA256:` + d[7:] + `" is not pinned by a sha256 digest (<registry>/compass-runner@sha256:<64 hex>)` + "\nRUNNER_IMAGE is missing"},
		{"another algorithm", "RUNNER_IMAGE=" + testRegistry + "/compass-runner@sha512:" + d[7:] + "\n" + rest,
			`line 1: RUNNER_IMAGE: "` + testRegistry + `/compass-runner@sha512:` + d[7:] + `" is not pinned by a sha256 digest (<registry>/compass-runner@sha256:<64 hex>)` + "\nRUNNER_IMAGE is missing"},
		{"a bad registry", "RUNNER_IMAGE=Bad Host/compass-runner@" + d + "\n" + rest,
			`line 1: RUNNER_IMAGE: "Bad Host/compass-runner@` + d + `": repository can only contain the characters ` + "`abcdefghijklmnopqrstuvwxyz0123456789_-./`: Bad Host/compass-runner\nRUNNER_IMAGE is missing"},
		{"the NATS image missing", compass, "NATS_IMAGE is missing"},
		{"the NATS image by tag", compass + "NATS_IMAGE=" + nats + "\n",
			`line 4: NATS_IMAGE: "` + nats + `" is not pinned by a sha256 digest (the chart's nats.image, then @sha256:<64 hex>)` + "\nNATS_IMAGE is missing"},
		{"the NATS image without its tag", compass + "NATS_IMAGE=" + pins[3].Repository + "@" + d + "\n",
			`line 4: NATS_IMAGE: "` + pins[3].Repository + `@` + d + `" has no tag: name the chart's nats.image with its tag, then the digest` + "\nNATS_IMAGE is missing"},
		{"the NATS image with a port and no tag", compass + "NATS_IMAGE=127.0.0.1:5000/nats@" + d + "\n",
			`line 4: NATS_IMAGE: "127.0.0.1:5000/nats@` + d + `" has no tag: name the chart's nats.image with its tag, then the digest` + "\nNATS_IMAGE is missing"},
		{"the NATS image with an empty tag", compass + "NATS_IMAGE=nats:@" + d + "\n",
			`line 4: NATS_IMAGE: "nats:@` + d + `" has no tag: name the chart's nats.image with its tag, then the digest` + "\nNATS_IMAGE is missing"},
		{"the NATS image with a bad repository", compass + "NATS_IMAGE=NATS:2.15.2-alpine@" + d + "\n",
			`line 4: NATS_IMAGE: "NATS:2.15.2-alpine@` + d + `": repository can only contain the characters ` + "`abcdefghijklmnopqrstuvwxyz0123456789_-./`" + `: NATS` + "\nNATS_IMAGE is missing"},
		{"empty", "", "RUNNER_IMAGE is missing\nCALLOUT_IMAGE is missing\nSERVER_IMAGE is missing\nNATS_IMAGE is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseImagesEnv([]byte(tc.env))
			if want := "chart: images.env: " + tc.want; err == nil || err.Error() != want {
				t.Fatalf("ParseImagesEnv: %v\nwant: %s", err, want)
			}
		})
	}
}

// TestPinChartValuesChangesOnlyTheImageValues pins the chart's own
// values.yaml: exactly the four lines of each Compass image and the NATS
// image's digest line change, each keeping its key, indentation and
// comment; every other line is the same.
func TestPinChartValuesChangesOnlyTheImageValues(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pins := testPins(t)
	out, err := PinChartValues(orig, pins, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckChartValues(out, pins, testVersion); err != nil {
		t.Fatal(err)
	}
	// The lines each image's values are on, found by the node positions.
	var doc yaml.Node
	if err := yaml.Unmarshal(orig, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[int]string{} // line number -> the value it must now hold
	for _, p := range pins {
		img, err := mappingPath(doc.Content[0], p.Key, "image")
		if err != nil {
			t.Fatal(err)
		}
		v := p.values(testVersion)
		for _, f := range p.setFields() {
			want[mappingValue(img, f).Line] = f + `: "` + v[f] + `"`
		}
	}
	before, after := strings.Split(string(orig), "\n"), strings.Split(string(out), "\n")
	if len(before) != len(after) {
		t.Fatalf("pinning changed the number of lines: %d, then %d", len(before), len(after))
	}
	changed := 0
	for i := range before {
		v, pinned := want[i+1]
		if !pinned {
			if before[i] != after[i] {
				t.Errorf("line %d changed: %q, then %q", i+1, before[i], after[i])
			}
			continue
		}
		changed++
		indent := before[i][:len(before[i])-len(strings.TrimLeft(before[i], " "))]
		_, comment, hasComment := strings.Cut(before[i], " #")
		if !strings.HasPrefix(after[i], indent+v) || (hasComment && !strings.HasSuffix(after[i], " #"+comment)) {
			t.Errorf("line %d is %q, want %q with the comment of %q", i+1, after[i], indent+v, before[i])
		}
	}
	if changed != 4*3+1 {
		t.Fatalf("%d lines hold pinned values, want %d (four of each Compass image, the NATS image's digest)", changed, 4*3+1)
	}
}

// TestPinChartValuesKeepsEachScalarStyle pins values written every way a
// one-line scalar can be, the workloads out of order, and checks the exact
// text: only each value's own characters are replaced.
func TestPinChartValuesKeepsEachScalarStyle(t *testing.T) {
	pins := testPins(t)
	nats := pins[3]
	// The NATS image's own values, each written another way: only its
	// digest is replaced.
	natsImage := fmt.Sprintf("nats:\n  image:\n    digest: 'sha256:old'  # single-quoted\n    tag: %s\n    repository: %q\n    registry: ''\n", nats.Tag, nats.Repository)
	in := natsImage + `# é: a comment with a character of two bytes
server:
  image:
    registry: 'it''s'   # single-quoted, an escaped quote
    repository: "a \" b" # double-quoted, an escaped quote
    tag: plain#not-a-comment
    digest: ""
runner:
  image:
    digest: ""
    tag: ""
    repository: "keys in another order"
    registry: ""
callout:
  image:
    registry: ghcr.io/compass-runner	# after a tab
    repository: compass-callout
    tag: ~
    digest: "é"
`
	v := func(i int, f string) string { return `"` + pins[i].values(testVersion)[f] + `"` }
	want := strings.Replace(natsImage, "'sha256:old'", v(3, "digest"), 1) + `# é: a comment with a character of two bytes
server:
  image:
    registry: ` + v(2, "registry") + `   # single-quoted, an escaped quote
    repository: ` + v(2, "repository") + ` # double-quoted, an escaped quote
    tag: ` + v(2, "tag") + `
    digest: ` + v(2, "digest") + `
runner:
  image:
    digest: ` + v(0, "digest") + `
    tag: ` + v(0, "tag") + `
    repository: ` + v(0, "repository") + `
    registry: ` + v(0, "registry") + `
callout:
  image:
    registry: ` + v(1, "registry") + `	# after a tab
    repository: ` + v(1, "repository") + `
    tag: ` + v(1, "tag") + `
    digest: ` + v(1, "digest") + `
`
	got, err := PinChartValues([]byte(in), pins, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("pinned:\n%s\nwant:\n%s", got, want)
	}
}

// natsValues is a values file's nats.image: p's registry, repository and
// tag, and digest as given.
func natsValues(p PinnedImage, digest string) string {
	return fmt.Sprintf("nats:\n  image:\n    registry: %q\n    repository: %q\n    tag: %q\n    digest: %s\n", p.Registry, p.Repository, p.Tag, digest)
}

func TestPinChartValuesRefusesWhatItCannotEditInPlace(t *testing.T) {
	pins := testPins(t)
	// good is a values file that pins, with each image's lines replaceable.
	img := "  image:\n    registry: r\n    repository: p\n    tag: \"\"\n    digest: \"\"\n"
	goodWith := func(runnerImage, nats string) string {
		return "runner:\n" + runnerImage + "callout:\n" + img + "server:\n" + img + nats
	}
	good := func(runnerImage string) string { return goodWith(runnerImage, natsValues(pins[3], `""`)) }
	natsDigest := "    digest: \"\"\n"
	if _, err := PinChartValues([]byte(good("  image:\n    registry: r\n    repository: p\n    tag: \"\"\n    digest: \"\"\n")), pins, testVersion); err != nil {
		t.Fatalf("the table's base values: %v", err)
	}
	for _, tc := range []struct{ name, values, want string }{
		{"a digest missing", good("  image:\n    registry: r\n    repository: p\n    tag: \"\"\n"), "runner.image has no digest"},
		{"an image not a mapping", good("  image: r/p:t\n"), "runner.image is not a mapping"},
		{"a workload missing", "callout:\n  image: {}\n" + natsValues(pins[3], `""`), "runner is not a mapping"},
		{"an empty value", good("  image:\n    registry: r\n    repository: p\n    tag:\n    digest: \"\"\n"), `runner.image.tag: has no value to replace`},
		{"a block scalar", good("  image:\n    registry: r\n    repository: p\n    tag: |\n      v1\n    digest: \"\"\n"), "runner.image.tag: is a block or flow scalar"},
		{"a quoted scalar over two lines", good("  image:\n    registry: r\n    repository: p\n    tag: \"v\n      1\"\n    digest: \"\"\n"), "runner.image.tag: is a quoted scalar over several lines"},
		{"a flow mapping", good("  image: {registry: r, repository: p, tag: t, digest: d}\n"), "runner.image is a flow mapping"},
		{"an anchor", good("  image:\n    registry: &r r\n    repository: p\n    tag: \"\"\n    digest: \"\"\n"), "runner.image.registry: has an anchor"},
		{"an alias", "anchored: &r v1\n" + good("  image:\n    registry: r\n    repository: p\n    tag: *r\n    digest: \"\"\n"), "runner.image.tag: is not a scalar"},
		{"the NATS image's digest missing", goodWith(img, strings.TrimSuffix(natsValues(pins[3], `""`), natsDigest)), "nats.image has no digest"},
		{"the NATS image's digest a block scalar", goodWith(img, natsValues(pins[3], ">\n      x")), "nats.image.digest: is a block or flow scalar"},
		{"the NATS image a flow mapping", goodWith(img, fmt.Sprintf("nats:\n  image: {registry: %q, repository: %s, tag: %s, digest: d}\n", pins[3].Registry, pins[3].Repository, pins[3].Tag)), "nats.image is a flow mapping"},
		{"a list", "- runner\n", "not one YAML mapping"},
		{"not YAML", "runner: [\n", "chart: values.yaml: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PinChartValues([]byte(tc.values), pins, testVersion)
			if err == nil || !strings.HasPrefix(err.Error(), "chart: values.yaml") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("PinChartValues: %v, want a values.yaml error with %q", err, tc.want)
			}
		})
	}
	t.Run("a value that is no image reference", func(t *testing.T) {
		bad := testPins(t)
		bad[1].Registry = "reg # injected"
		_, err := PinChartValues([]byte(good("  image:\n    registry: r\n    repository: p\n    tag: \"\"\n    digest: \"\"\n")), bad, testVersion)
		if err == nil || !strings.Contains(err.Error(), `callout.image.registry: "reg # injected" is not a registry`) {
			t.Fatalf("PinChartValues: %v, want the registry refused", err)
		}
	})
}

// TestPinChartValuesRefusesANATSImageNotTheChartsOwn: images.env's
// NATS_IMAGE must name the chart's nats.image as it is (registry,
// repository, tag); the release pins that image by digest and never
// changes which image it is. The refusal names both.
func TestPinChartValuesRefusesANATSImageNotTheChartsOwn(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pins := testPins(t)
	own := pins[3]
	with := func(registry, repository, tag string) []PinnedImage {
		p := slices.Clone(pins)
		p[3].Registry, p[3].Repository, p[3].Tag = registry, repository, tag
		return p
	}
	refused := func(envName, chartName string) string {
		return "chart: values.yaml: images.env's NATS_IMAGE names " + envName + ", not the chart's nats.image " + chartName +
			": the release pins the chart's own image by digest"
	}
	// A chart whose NATS image is written with the same name split
	// otherwise: images.env's line splits at the last slash.
	pathInRepository := []byte(strings.Replace(string(orig), "    repository: "+own.Repository+"\n", "    repository: library/"+own.Repository+"\n", 1))
	if bytes.Equal(pathInRepository, orig) {
		t.Fatalf("values.yaml has no line %q", "    repository: "+own.Repository)
	}
	for _, tc := range []struct {
		name   string
		values []byte
		pins   []PinnedImage
		want   string
	}{
		{"the release's version as tag", orig, with(own.Registry, own.Repository, testVersion),
			refused(own.Repository+":"+testVersion, own.Name(""))},
		{"another tag", orig, with(own.Registry, own.Repository, "latest"),
			refused(own.Repository+":latest", own.Name(""))},
		{"another repository", orig, with(own.Registry, "nats-server", own.Tag),
			refused("nats-server:"+own.Tag, own.Name(""))},
		{"a registry the chart does not name", orig, with("docker.io/library", own.Repository, own.Tag),
			refused("docker.io/library/"+own.Name(""), own.Name(""))},
		{"the same name split otherwise", pathInRepository, with("library", own.Repository, own.Tag),
			refused(fmt.Sprintf("library/%s (registry %q, repository %q, tag %q)", own.Name(""), "library", own.Repository, own.Tag),
				fmt.Sprintf("library/%s (registry %q, repository %q, tag %q)", own.Name(""), "", "library/"+own.Repository, own.Tag))},
		{"a chart's NATS image without a tag", []byte(strings.Replace(string(orig), "    tag: "+own.Tag+"\n", "    tag: \"\"\n", 1)), pins,
			"chart: values.yaml: nats.image has no tag: the release pins it by the digest of its tag"},
		{"a chart's NATS tag not a string", []byte(strings.Replace(string(orig), "    tag: "+own.Tag+"\n", "    tag: 2.15\n", 1)), pins,
			"chart: values.yaml: nats.image.tag is 2.15, not a string"},
		{"a chart without a NATS image", []byte(strings.Replace(string(orig), "\nnats:\n", "\nnats-old:\n", 1)), pins,
			"chart: values.yaml: nats.image is not a mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PinChartValues(tc.values, tc.pins, testVersion)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("PinChartValues: %v\nwant: %s", err, tc.want)
			}
		})
	}
}

func TestChartVersionsMustBeVERSION(t *testing.T) {
	meta := func(api, name, version, app string) []byte {
		return fmt.Appendf(nil, "apiVersion: %s\nname: %s\nversion: %s\nappVersion: %s\n", api, name, version, app)
	}
	if err := CheckChartMeta(meta("v2", "compass", "0.1.0", "v0.1.0"), "v0.1.0"); err != nil {
		t.Fatal(err)
	}
	if err := CheckChartMeta(meta("v2", "compass", "1.2.3-rc.1", "v1.2.3-rc.1"), "v1.2.3-rc.1"); err != nil {
		t.Fatal(err)
	}
	// The chart in the repository is the VERSION file's.
	version, err := os.ReadFile(filepath.Join("..", "..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	chartYAML, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckChartMeta(chartYAML, strings.TrimSpace(string(version))); err != nil {
		t.Fatalf("deploy/chart/compass/Chart.yaml: %v", err)
	}
	for _, tc := range []struct {
		name string
		meta []byte
		want string
	}{
		{"the chart version with its v", meta("v2", "compass", "v0.1.0", "v0.1.0"), `version is "v0.1.0", not 0.1.0`},
		{"another chart version", meta("v2", "compass", "0.1.1", "v0.1.0"), `version is "0.1.1", not 0.1.0`},
		{"an appVersion without the v", meta("v2", "compass", "0.1.0", "0.1.0"), `appVersion is "0.1.0", not VERSION v0.1.0`},
		{"another chart", meta("v2", "nats", "0.1.0", "v0.1.0"), `name is "nats", not compass`},
		{"a Helm 2 chart", meta("v1", "compass", "0.1.0", "v0.1.0"), `apiVersion is "v1", not v2`},
		{"not YAML", []byte("name: [\n"), "chart: Chart.yaml: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckChartMeta(tc.meta, "v0.1.0")
			if err == nil || !strings.HasPrefix(err.Error(), "chart: Chart.yaml") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckChartMeta: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCheckChartValuesNamesEachWrongValue changes each pinned value in turn
// and expects that value, and only it, named.
func TestCheckChartValuesNamesEachWrongValue(t *testing.T) {
	pins := testPins(t)
	good := ImageValuesYAML(pins, testVersion)
	if err := CheckChartValues(good, pins, testVersion); err != nil {
		t.Fatalf("values-images.yaml: %v", err)
	}
	for _, p := range pins {
		for f, v := range p.values(testVersion) {
			t.Run(p.Key+" "+f, func(t *testing.T) {
				line := fmt.Sprintf("    %s: %q\n", f, v)
				// The first occurrence after the workload's key is its own.
				at := bytes.Index(good, []byte(p.Key+":\n"))
				i := bytes.Index(good[at:], []byte(line))
				if at < 0 || i < 0 {
					t.Fatalf("values-images.yaml has no %q under %s", line, p.Key)
				}
				bad := slices.Concat(good[:at+i], fmt.Appendf(nil, "    %s: %q\n", f, v+"x"), good[at+i+len(line):])
				err := CheckChartValues(bad, pins, testVersion)
				wantMsg := fmt.Sprintf("%s.image.%s is %q, not %q", p.Key, f, v+"x", v)
				if err == nil || !strings.Contains(err.Error(), wantMsg) || strings.Count(err.Error(), "\n") != 1 {
					t.Fatalf("CheckChartValues: %v, want only %q", err, wantMsg)
				}
			})
		}
	}
	serverDigest := fmt.Sprintf("    digest: %q\n", pins[2].Digest)
	for _, tc := range []struct{ name, values, want string }{
		{"a mirror", "imageRegistry: mirror.example\n" + string(good), `imageRegistry is mirror.example`},
		{"a digest not a string", strings.Replace(string(good), serverDigest, "    digest: 1\n", 1), `server.image.digest is 1, not the string "` + pins[2].Digest + `"`},
		{"an image missing", strings.Replace(string(good), "callout:\n", "callout-old:\n", 1), "callout.image is missing"},
		{"not YAML", "runner: [\n", "chart: values: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckChartValues([]byte(tc.values), pins, testVersion); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckChartValues: %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("the chart's own values", func(t *testing.T) {
		orig, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		err = CheckChartValues(orig, pins, testVersion)
		for _, p := range pins {
			if err == nil || !strings.Contains(err.Error(), p.Key+`.image.digest is "", not "`+p.Digest+`"`) {
				t.Fatalf("CheckChartValues of the unpinned chart: %v, want %s's digest named", err, p.Key)
			}
		}
	})
}

// archiveEntry is one entry of a test archive.
type archiveEntry struct {
	name, body string
	typ        byte
}

func chartArchive(t *testing.T, entries ...archiveEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: e.typ}
		if e.typ == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
			h.Linkname = e.body
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestChartArchiveYieldsOnlyItsOwnFiles(t *testing.T) {
	meta := archiveEntry{name: "compass/Chart.yaml", body: "name: compass\n"}
	values := archiveEntry{name: "compass/values.yaml", body: "runner: {}\n"}
	tmpl := archiveEntry{name: "compass/templates/runner.yaml", body: "kind: DaemonSet\n"}
	gotMeta, gotValues, err := ReadChartArchive(bytes.NewReader(chartArchive(t, meta, tmpl, values)))
	if err != nil {
		t.Fatal(err)
	}
	if string(gotMeta) != meta.body || string(gotValues) != values.body {
		t.Fatalf("ReadChartArchive = %q, %q, want %q, %q", gotMeta, gotValues, meta.body, values.body)
	}
	for _, tc := range []struct {
		name    string
		archive []byte
		want    string
	}{
		{"values.yaml missing", chartArchive(t, meta, tmpl), "no compass/Chart.yaml or compass/values.yaml"},
		{"another chart", chartArchive(t, archiveEntry{name: "nats/Chart.yaml", body: "x"}, values), `entry "nats/Chart.yaml" is not under compass/`},
		{"an entry leaving the chart", chartArchive(t, meta, archiveEntry{name: "compass/../values.yaml", body: "x"}), `entry "compass/../values.yaml" is not under compass/`},
		{"values.yaml twice", chartArchive(t, meta, values, values), "compass/values.yaml is in the archive twice"},
		{"values.yaml a link", chartArchive(t, meta, archiveEntry{name: "compass/values.yaml", body: "/etc/passwd", typ: tar.TypeSymlink}), "compass/values.yaml is not a regular file"},
		{"values.yaml too big", chartArchive(t, meta, archiveEntry{name: "compass/values.yaml", body: strings.Repeat("#", maxChartFile+1)}), "compass/values.yaml is not a regular file of at most"},
		{"not gzip", []byte("compass/Chart.yaml"), "not a gzip archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadChartArchive(bytes.NewReader(tc.archive))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadChartArchive: %v, want %q", err, tc.want)
			}
		})
	}
}

// packChart writes dir as a chart archive, the way helm package lays it
// out (every file under compass/).
func packChart(t *testing.T, dir, out string) {
	t.Helper()
	var entries []archiveEntry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		entries = append(entries, archiveEntry{name: "compass/" + filepath.ToSlash(rel), body: string(b)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, chartArchive(t, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyChart copies the repository's chart into a new directory.
func copyChart(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "compass")
	if err := os.CopyFS(dst, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestCLIChartPinThenCheck(t *testing.T) {
	version, err := os.ReadFile(filepath.Join("..", "..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(version))
	pins := testPins(t)
	dir := t.TempDir()
	env := filepath.Join(dir, "images.env")
	if err := os.WriteFile(env, []byte(imagesEnv(pins)), 0o644); err != nil {
		t.Fatal(err)
	}
	chart := copyChart(t)
	valuesOut := filepath.Join(dir, "values-images.yaml")
	code, stdout, stderr := runCLI(t, "chart-pin", "--chart", chart, "--images-env", env, "--version", v, "--values-out", valuesOut)
	if code != 0 {
		t.Fatalf("chart-pin exited %d: %s", code, stderr)
	}
	for _, p := range pins {
		if !strings.Contains(stdout, p.Key+" "+p.Ref(v)+"\n") {
			t.Errorf("chart-pin printed %q, without %s %s", stdout, p.Key, p.Ref(v))
		}
	}
	tgz := filepath.Join(dir, "compass.tgz")
	packChart(t, chart, tgz)
	code, stdout, stderr = runCLI(t, "chart-check", "--chart", tgz, "--values", valuesOut, "--images-env", env, "--version", v)
	if code != 0 || !strings.Contains(stdout, tgz+": compass") || !strings.Contains(stdout, valuesOut+": every image pinned") {
		t.Fatalf("chart-check exited %d: %s%s", code, stdout, stderr)
	}

	// Against other digests, both the chart and the values file fail, each
	// naming what differs: the Server's, and the NATS image's.
	other := testPins(t)
	other[2].Digest = fakeDigest("another build")
	other[3].Digest = fakeDigest("nats, another day")
	otherEnv := filepath.Join(dir, "other.env")
	if err := os.WriteFile(otherEnv, []byte(imagesEnv(other)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, target := range [][]string{{"--chart", tgz}, {"--values", valuesOut}} {
		code, _, stderr = runCLI(t, append([]string{"chart-check", "--images-env", otherEnv, "--version", v}, target...)...)
		want := "images: " + target[1] + ":\n  chart: the values pin other images than images.env:\n" +
			`  server.image.digest is "` + pins[2].Digest + `", not "` + other[2].Digest + `"` + "\n" +
			`  nats.image.digest is "` + pins[3].Digest + `", not "` + other[3].Digest + `"` + "\n"
		if code != 1 || stderr != want {
			t.Fatalf("chart-check %s against other digests exited %d: %s\nwant: %s", target[1], code, stderr, want)
		}
	}
	// values-images.yaml carries the NATS image, as the chart names it.
	if iv := mustRead(t, valuesOut); !bytes.Contains(iv, []byte(natsValues(pins[3], `"`+pins[3].Digest+`"`))) {
		t.Fatalf("values-images.yaml has no\n%s\n%s", natsValues(pins[3], `"`+pins[3].Digest+`"`), iv)
	}
	orig, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	// A NATS_IMAGE of another image than the chart's is refused, naming
	// both, and the chart is left as it was.
	latest := testPins(t)
	latest[3].Tag = "latest"
	latestEnv := filepath.Join(dir, "latest.env")
	if err := os.WriteFile(latestEnv, []byte(imagesEnv(latest)), 0o644); err != nil {
		t.Fatal(err)
	}
	chart3 := copyChart(t)
	code, stdout, stderr = runCLI(t, "chart-pin", "--chart", chart3, "--images-env", latestEnv, "--version", v)
	want := "images: " + chart3 + ":\n  chart: values.yaml: images.env's NATS_IMAGE names " + latest[3].Name("") +
		", not the chart's nats.image " + pins[3].Name("") + ": the release pins the chart's own image by digest\n"
	if code != 1 || stdout != "" || stderr != want {
		t.Fatalf("chart-pin of another NATS image exited %d: %s%s\nwant: %s", code, stdout, stderr, want)
	}
	if after, err := os.ReadFile(filepath.Join(chart3, "values.yaml")); err != nil || !bytes.Equal(after, orig) {
		t.Fatalf("a refused chart-pin changed values.yaml (%v)", err)
	}
	// The chart of another version is neither pinned nor changed.
	chart2 := copyChart(t)
	code, _, stderr = runCLI(t, "chart-pin", "--chart", chart2, "--images-env", env, "--version", "v9.9.9")
	if code != 1 || !strings.Contains(stderr, `version is "`+strings.TrimPrefix(v, "v")+`", not 9.9.9`) {
		t.Fatalf("chart-pin of version v9.9.9 exited %d: %s", code, stderr)
	}
	if after, err := os.ReadFile(filepath.Join(chart2, "values.yaml")); err != nil || !bytes.Equal(after, orig) {
		t.Fatalf("a refused chart-pin changed values.yaml (%v)", err)
	}
}

func TestCLIChartCommandsExitTwoOnUsageErrors(t *testing.T) {
	env := filepath.Join(t.TempDir(), "images.env")
	if err := os.WriteFile(env, []byte(imagesEnv(testPins(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"pin without a chart", []string{"chart-pin", "--images-env", env, "--version", testVersion}, "--chart, --images-env and --version are required"},
		{"check without a target", []string{"chart-check", "--images-env", env, "--version", testVersion}, "--chart or --values are required"},
		{"a version without its v", []string{"chart-check", "--values", env, "--images-env", env, "--version", "0.1.0"}, `--version "0.1.0" is not a semantic version`},
		{"the NATS image without values", []string{"chart-nats"}, "--values is required"},
		{"the NATS image at a registry with a path", []string{"chart-nats", "--values", env, "--registry", "127.0.0.1:5000/library"}, `--registry "127.0.0.1:5000/library" is not a registry host[:port]`},
		{"the NATS image at no registry", []string{"chart-nats", "--values", env, "--registry", "Bad Host"}, `--registry "Bad Host" is not a registry host[:port]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exited %d: %s, want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}

// TestCLIChartNATSPrintsTheChartsImage: chart-nats prints the chart's NATS
// image as images.env's NATS_IMAGE names it and where the release reads its
// digest: Docker Hub's full name for an image without a registry, the
// image's own registry otherwise, or the same path on --registry.
func TestCLIChartNATSPrintsTheChartsImage(t *testing.T) {
	own := chartNATS(t)
	orig := string(mustRead(t, filepath.Join(chartDir, "values.yaml")))
	withImage := func(registry, repository string) string {
		v := strings.Replace(orig, "    registry: \"\"\n    repository: "+own.Repository+"\n", fmt.Sprintf("    registry: %q\n    repository: %q\n", registry, repository), 1)
		if v == orig {
			t.Fatalf("values.yaml has no nats.image registry \"\" and repository %s", own.Repository)
		}
		return v
	}
	for _, tc := range []struct {
		name, values string
		args         []string
		want         string
	}{
		{"the repository's chart", orig, nil,
			own.Name("") + " docker.io/library/" + own.Name("") + "\n"},
		{"the dry run's loopback registry", orig, []string{"--registry", "127.0.0.1:41234"},
			own.Name("") + " 127.0.0.1:41234/library/" + own.Name("") + "\n"},
		{"a registry of its own", withImage("quay.io/nats-io", own.Repository), nil,
			"quay.io/nats-io/" + own.Name("") + " quay.io/nats-io/" + own.Name("") + "\n"},
		{"a registry of its own, read from another", withImage("quay.io/nats-io", own.Repository), []string{"--registry", "127.0.0.1:41234"},
			"quay.io/nats-io/" + own.Name("") + " 127.0.0.1:41234/nats-io/" + own.Name("") + "\n"},
		{"a Docker Hub organisation", withImage("", "synadia/"+own.Repository), nil,
			"synadia/" + own.Name("") + " docker.io/synadia/" + own.Name("") + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(tc.values), 0o644); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runCLI(t, append([]string{"chart-nats", "--values", values}, tc.args...)...)
			if code != 0 || stdout != tc.want {
				t.Fatalf("chart-nats exited %d: %q%s, want %q", code, stdout, stderr, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, values, want string }{
		{"no tag", strings.Replace(orig, "    tag: "+own.Tag+"\n", "    tag: \"\"\n", 1), "nats.image has no tag: the release pins it by the digest of its tag"},
		{"no NATS image", strings.Replace(orig, "\nnats:\n", "\nnats-old:\n", 1), "nats.image is not a mapping"},
		{"a repository no image has", strings.Replace(orig, "    repository: "+own.Repository+"\n", "    repository: NATS\n", 1),
			"nats.image NATS:" + own.Tag + ": repository can only contain the characters `abcdefghijklmnopqrstuvwxyz0123456789_-./`: NATS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(tc.values), 0o644); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runCLI(t, "chart-nats", "--values", values)
			if want := "images: chart: " + values + ": " + tc.want + "\n"; code != 1 || stdout != "" || stderr != want {
				t.Fatalf("chart-nats exited %d: %q%s, want 1 and %s", code, stdout, stderr, want)
			}
		})
	}
}
