package main

// The release's chart: deploy/chart/compass with each Compass image pinned
// to the digest the release built and pushed. An operator who installs the
// chart from the release's OCI repository, or renders manifests with the
// release's values-images.yaml, runs exactly the images whose digests the
// release published in images.env; a tag alone could be moved by whoever
// can push to the registry, a digest cannot.
//
// values.yaml is the chart's documentation of every value, so the pinning
// edits only the four scalars of each image in place and keeps every other
// byte (comments included); it then decodes the result and fails unless it
// differs from the original in exactly those values.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/google/go-containerregistry/pkg/name"
	"go.yaml.in/yaml/v3"
)

// chartName is the chart's name in Chart.yaml and the top directory of its
// packaged archive.
const chartName = "compass"

// Limits on what the chart commands read, each with its reason.
const (
	// maxChartFile bounds one file read from a chart or a values file: the
	// chart's values.yaml is about 7 KiB, Chart.yaml under 1 KiB.
	maxChartFile = 1 << 20
	// maxChartArchive bounds the bytes a packaged chart may expand to, so a
	// hostile archive pulled from a registry cannot fill the memory or disk.
	maxChartArchive = 16 << 20
	// maxImagesEnv bounds images.env: three lines of about 120 bytes.
	maxImagesEnv = 64 << 10
)

// chartImage is a Compass image the chart runs: images.env's variable, the
// chart's values key and the program (the image repository's last path
// element).
type chartImage struct{ Var, Key, Program string }

// chartImages are the three, in images.env's order.
var chartImages = []chartImage{
	{"RUNNER_IMAGE", "runner", "compass-runner"},
	{"CALLOUT_IMAGE", "callout", "compass-callout"},
	{"SERVER_IMAGE", "server", "compass-server"},
}

var (
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	// valueRE is what a pinned value may hold: a registry with its port and
	// path, a repository, a tag, a digest. Nothing YAML would read as other
	// than the string in double quotes.
	valueRE = regexp.MustCompile(`^[A-Za-z0-9._:/@-]+$`)
)

// PinnedImage is one Compass image as the release published it.
type PinnedImage struct {
	Key        string // the chart's values key: runner, callout, server
	Registry   string // host[:port]/namespace, e.g. ghcr.io/compass-runner
	Repository string // the program, e.g. compass-runner
	Digest     string // sha256:<64 hex>, the image index's digest
}

// Ref is the image's reference as the chart renders it with tag version.
func (p PinnedImage) Ref(version string) string {
	return p.Registry + "/" + p.Repository + ":" + version + "@" + p.Digest
}

// values are the chart values that pin the image.
func (p PinnedImage) values(version string) map[string]string {
	return map[string]string{"registry": p.Registry, "repository": p.Repository, "tag": version, "digest": p.Digest}
}

// imageFields are the keys of a chart image, in values.yaml's order.
var imageFields = []string{"registry", "repository", "tag", "digest"}

// ParseImagesEnv reads images.env as .ci/release writes it: one line
// VAR=<registry>/<program>@sha256:<hex> for each Compass image, each exactly
// once. It returns them in chartImages' order.
func ParseImagesEnv(data []byte) ([]PinnedImage, error) {
	byVar := map[string]PinnedImage{}
	var errs []error
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		v, ref, ok := strings.Cut(line, "=")
		idx := slices.IndexFunc(chartImages, func(c chartImage) bool { return c.Var == v })
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("line %d is not VAR=REFERENCE", i+1))
			continue
		case idx < 0:
			errs = append(errs, fmt.Errorf("line %d: %q is not one of RUNNER_IMAGE, CALLOUT_IMAGE, SERVER_IMAGE", i+1, v))
			continue
		}
		if _, dup := byVar[v]; dup {
			errs = append(errs, fmt.Errorf("line %d: %s is given twice", i+1, v))
			continue
		}
		p, err := parsePinnedRef(ref, chartImages[idx].Key, chartImages[idx].Program)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %s: %w", i+1, v, err))
			continue
		}
		byVar[v] = p
	}
	var out []PinnedImage
	for _, c := range chartImages {
		p, ok := byVar[c.Var]
		if !ok {
			errs = append(errs, fmt.Errorf("%s is missing", c.Var))
		}
		out = append(out, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("chart: images.env: %w", err)
	}
	return out, nil
}

// parsePinnedRef reads <registry>/<program>@sha256:<hex>: by digest, with
// no tag, and the program the variable names.
func parsePinnedRef(ref, key, program string) (PinnedImage, error) {
	repo, digest, ok := strings.Cut(ref, "@")
	if !ok || !digestRE.MatchString(digest) {
		return PinnedImage{}, fmt.Errorf("%q is not pinned by a sha256 digest (<registry>/%s@sha256:<64 hex>)", ref, program)
	}
	slash := strings.LastIndex(repo, "/")
	if slash <= 0 || repo[slash+1:] != program {
		return PinnedImage{}, fmt.Errorf("%q is not <registry>/%s@<digest>", ref, program)
	}
	if _, err := name.NewDigest(ref, name.StrictValidation); err != nil {
		return PinnedImage{}, fmt.Errorf("%q: %w", ref, err)
	}
	p := PinnedImage{Key: key, Registry: repo[:slash], Repository: program, Digest: digest}
	if !valueRE.MatchString(p.Registry) {
		return PinnedImage{}, fmt.Errorf("%q: registry %q has characters no image registry has", ref, p.Registry)
	}
	return p, nil
}

// chartVersion is the chart's version for a release version: semantic
// versioning without the leading v, as Helm wants it.
func chartVersion(version string) string { return strings.TrimPrefix(version, "v") }

// CheckChartMeta checks Chart.yaml against the release: the chart is
// compass, its version the release's without the v and its appVersion the
// release's (the tag of every Compass image without one).
func CheckChartMeta(chartYAML []byte, version string) error {
	var c struct {
		APIVersion string `yaml:"apiVersion"`
		Name       string `yaml:"name"`
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(chartYAML, &c); err != nil {
		return fmt.Errorf("chart: Chart.yaml: %w", err)
	}
	var errs []error
	if c.APIVersion != "v2" {
		errs = append(errs, fmt.Errorf("apiVersion is %q, not v2", c.APIVersion))
	}
	if c.Name != chartName {
		errs = append(errs, fmt.Errorf("name is %q, not %s", c.Name, chartName))
	}
	if c.Version != chartVersion(version) {
		errs = append(errs, fmt.Errorf("version is %q, not %s (VERSION %s without the v)", c.Version, chartVersion(version), version))
	}
	if c.AppVersion != version {
		errs = append(errs, fmt.Errorf("appVersion is %q, not VERSION %s", c.AppVersion, version))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("chart: Chart.yaml is not the release's:\n%w", err)
	}
	return nil
}

// PinChartValues returns the chart's values.yaml with each image's
// registry, repository, tag (the version) and digest set to the release's,
// every other byte as it was.
func PinChartValues(values []byte, pins []PinnedImage, version string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("chart: values.yaml: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("chart: values.yaml: not one YAML mapping")
	}
	lines := lineStarts(values)
	type edit struct {
		start, end int
		text       string
	}
	var edits []edit
	for _, p := range pins {
		img, err := mappingPath(doc.Content[0], p.Key, "image")
		if err != nil {
			return nil, fmt.Errorf("chart: values.yaml: %w", err)
		}
		if img.Style&yaml.FlowStyle != 0 {
			// Its plain scalars end at a comma, which scalarSpan does not
			// look for.
			return nil, fmt.Errorf("chart: values.yaml: %s.image is a flow mapping; write it as a block", p.Key)
		}
		want := p.values(version)
		for _, f := range imageFields {
			n := mappingValue(img, f)
			if n == nil {
				return nil, fmt.Errorf("chart: values.yaml: %s.image has no %s", p.Key, f)
			}
			start, end, err := scalarSpan(values, lines, n)
			if err != nil {
				return nil, fmt.Errorf("chart: values.yaml: %s.image.%s: %w", p.Key, f, err)
			}
			if !valueRE.MatchString(want[f]) {
				return nil, fmt.Errorf("chart: values.yaml: %s.image.%s: %q is not a registry, repository, tag or digest", p.Key, f, want[f])
			}
			edits = append(edits, edit{start, end, `"` + want[f] + `"`})
		}
	}
	// values.yaml may list the workloads in any order.
	sort.Slice(edits, func(i, j int) bool { return edits[i].start < edits[j].start })
	var out bytes.Buffer
	prev := 0
	for _, e := range edits {
		if e.start < prev {
			return nil, errors.New("chart: values.yaml: two image values share their text (an anchor or alias?)")
		}
		out.Write(values[prev:e.start])
		out.WriteString(e.text)
		prev = e.end
	}
	out.Write(values[prev:])
	// The whole decoded document must be the original's with the pinned
	// values set and nothing else changed.
	var before, after map[string]any
	if err := yaml.Unmarshal(values, &before); err != nil {
		return nil, fmt.Errorf("chart: values.yaml: %w", err)
	}
	if err := yaml.Unmarshal(out.Bytes(), &after); err != nil {
		return nil, fmt.Errorf("chart: values.yaml after pinning does not parse: %w", err)
	}
	for _, p := range pins {
		w, _ := before[p.Key].(map[string]any)
		img, _ := w["image"].(map[string]any)
		if img == nil {
			return nil, fmt.Errorf("chart: values.yaml: %s.image is not a mapping", p.Key)
		}
		for f, v := range p.values(version) {
			img[f] = v
		}
	}
	if !reflect.DeepEqual(before, after) {
		return nil, errors.New("chart: values.yaml: pinning the images changed more than their values")
	}
	return out.Bytes(), nil
}

// lineStarts are the byte offsets at which each line of src starts.
func lineStarts(src []byte) []int {
	starts := []int{0}
	for i, b := range src {
		if b == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

// mappingValue is the value of key in mapping n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// mappingPath follows keys from mapping n to a mapping.
func mappingPath(n *yaml.Node, keys ...string) (*yaml.Node, error) {
	for i, k := range keys {
		n = mappingValue(n, k)
		if n == nil || n.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("%s is not a mapping", strings.Join(keys[:i+1], "."))
		}
	}
	return n, nil
}

// scalarSpan is where scalar n's text is in src: from its first byte to
// past its last (the closing quote of a quoted one). Only a scalar written
// on one line, plain or quoted, is found; anything else is refused, and the
// decoding PinChartValues does after its edits is the check of this.
func scalarSpan(src []byte, lines []int, n *yaml.Node) (start, end int, err error) {
	switch {
	case n.Kind != yaml.ScalarNode:
		return 0, 0, errors.New("is not a scalar")
	case n.Anchor != "":
		// Its position is the anchor's, and an alias elsewhere would take
		// the pinned value too.
		return 0, 0, fmt.Errorf("has an anchor (&%s); write the value itself", n.Anchor)
	case n.Style == 0 && n.Value == "":
		return 0, 0, errors.New(`has no value to replace; write "" for an empty one`)
	}
	if n.Line < 1 || n.Line > len(lines) || n.Column < 1 {
		return 0, 0, fmt.Errorf("has no position (line %d, column %d)", n.Line, n.Column)
	}
	lineStart := lines[n.Line-1]
	lineEnd := len(src)
	if n.Line < len(lines) {
		lineEnd = lines[n.Line] - 1
	}
	line := src[lineStart:lineEnd]
	// The column counts characters, not bytes.
	off := 0
	for c := 1; c < n.Column; c++ {
		if off >= len(line) {
			return 0, 0, fmt.Errorf("column %d is past line %d", n.Column, n.Line)
		}
		_, w := utf8.DecodeRune(line[off:])
		off += w
	}
	switch n.Style {
	case yaml.DoubleQuotedStyle:
		for i := off + 1; i < len(line); i++ {
			switch line[i] {
			case '\\':
				i++
			case '"':
				return lineStart + off, lineStart + i + 1, nil
			}
		}
	case yaml.SingleQuotedStyle:
		for i := off + 1; i < len(line); i++ {
			if line[i] == '\'' {
				if i+1 < len(line) && line[i+1] == '\'' {
					i++
					continue
				}
				return lineStart + off, lineStart + i + 1, nil
			}
		}
	case 0:
		i := off
		for i < len(line) && !(line[i] == '#' && i > off && (line[i-1] == ' ' || line[i-1] == '\t')) {
			i++
		}
		return lineStart + off, lineStart + off + len(bytes.TrimRight(line[off:i], " \t\r")), nil
	default:
		return 0, 0, errors.New("is a block or flow scalar; write it on one line, plain or quoted")
	}
	return 0, 0, errors.New("is a quoted scalar over several lines; write it on one line")
}

// CheckChartValues checks that values (a chart's values.yaml, or a values
// file laid over it) pin each image to the release's: registry,
// repository, tag and digest. A values.yaml that sets imageRegistry would
// send every image to another registry and is refused too.
func CheckChartValues(values []byte, pins []PinnedImage, version string) error {
	var v map[string]any
	if err := yaml.Unmarshal(values, &v); err != nil {
		return fmt.Errorf("chart: values: %w", err)
	}
	var errs []error
	if r, ok := v["imageRegistry"]; ok && r != "" && r != nil {
		errs = append(errs, fmt.Errorf("imageRegistry is %v, which replaces the registry of every pinned image", r))
	}
	for _, p := range pins {
		w, _ := v[p.Key].(map[string]any)
		img, _ := w["image"].(map[string]any)
		if img == nil {
			errs = append(errs, fmt.Errorf("%s.image is missing", p.Key))
			continue
		}
		want := p.values(version)
		for _, f := range imageFields {
			switch got, ok := img[f].(string); {
			case !ok:
				errs = append(errs, fmt.Errorf("%s.image.%s is %v, not the string %q", p.Key, f, img[f], want[f]))
			case got != want[f]:
				errs = append(errs, fmt.Errorf("%s.image.%s is %q, not %q", p.Key, f, got, want[f]))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("chart: the values pin other images than images.env:\n%w", err)
	}
	return nil
}

// ImageValuesYAML is values-images.yaml: only the image values of the
// release's chart, for `helm install -f` over another chart source (a
// mirror of the chart, the repository's deploy/chart/compass).
// `compass-server manifests` takes the images as flags (images.env), not
// from a values file: its --values refuses a value a flag sets.
func ImageValuesYAML(pins []PinnedImage, version string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# The Compass %s images, each pinned by the digest the release published\n", version)
	b.WriteString("# (images.env), for helm install/upgrade -f values-images.yaml. server.image\n")
	b.WriteString("# is used only where the Server is rendered (server.enabled). compass-server\n")
	b.WriteString("# manifests takes the images from images.env as flags instead.\n")
	for _, p := range pins {
		fmt.Fprintf(&b, "%s:\n  image:\n", p.Key)
		want := p.values(version)
		for _, f := range imageFields {
			fmt.Fprintf(&b, "    %s: %q\n", f, want[f])
		}
	}
	return []byte(b.String())
}

// ReadChartArchive reads Chart.yaml and values.yaml from a packaged chart
// (helm package's .tgz, or one helm pull fetched): gzip over tar, every
// entry under compass/.
func ReadChartArchive(r io.Reader) (chartYAML, values []byte, err error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, nil, fmt.Errorf("not a gzip archive: %w", err)
	}
	tr := tar.NewReader(io.LimitReader(zr, maxChartArchive))
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("not a tar archive within %d bytes: %w", maxChartArchive, err)
		}
		clean := path.Clean(h.Name)
		if clean != h.Name || !strings.HasPrefix(clean, chartName+"/") {
			return nil, nil, fmt.Errorf("entry %q is not under %s/", h.Name, chartName)
		}
		if total += h.Size; total > maxChartArchive {
			return nil, nil, fmt.Errorf("expands past %d bytes", maxChartArchive)
		}
		var dst *[]byte
		switch clean {
		case chartName + "/Chart.yaml":
			dst = &chartYAML
		case chartName + "/values.yaml":
			dst = &values
		default:
			continue
		}
		if *dst != nil {
			return nil, nil, fmt.Errorf("%s is in the archive twice", clean)
		}
		if h.Typeflag != tar.TypeReg || h.Size > maxChartFile {
			return nil, nil, fmt.Errorf("%s is not a regular file of at most %d bytes", clean, maxChartFile)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", clean, err)
		}
		*dst = b
	}
	if chartYAML == nil || values == nil {
		return nil, nil, fmt.Errorf("no %s/Chart.yaml or %s/values.yaml", chartName, chartName)
	}
	return chartYAML, values, nil
}

// runChartPin pins the images of an unpacked chart (a copy: values.yaml is
// rewritten) to images.env's and writes values-images.yaml.
func runChartPin(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("chart-pin", flag.ContinueOnError)
	dir := fs.String("chart", "", "the unpacked chart to pin, a copy of deploy/chart/compass: its values.yaml is rewritten (required)")
	env := fs.String("images-env", "", "the release's images.env: RUNNER_IMAGE, CALLOUT_IMAGE, SERVER_IMAGE by digest (required)")
	version := fs.String("version", "", "the release's VERSION, e.g. v0.1.0: the images' tag and the chart's appVersion (required)")
	valuesOut := fs.String("values-out", "", "also write the image values alone to this file (values-images.yaml)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *dir == "" || *env == "" || *version == "" {
		return usageError{"--chart, --images-env and --version are required"}
	}
	pins, err := readPins(*env, *version)
	if err != nil {
		return err
	}
	meta, err := readFileMax("chart", filepath.Join(*dir, "Chart.yaml"), maxChartFile)
	if err != nil {
		return err
	}
	if err := CheckChartMeta(meta, *version); err != nil {
		return inFile(*dir, err)
	}
	valuesFile := filepath.Join(*dir, "values.yaml")
	values, err := readFileMax("chart", valuesFile, maxChartFile)
	if err != nil {
		return err
	}
	pinned, err := PinChartValues(values, pins, *version)
	if err != nil {
		return inFile(*dir, err)
	}
	if err := CheckChartValues(pinned, pins, *version); err != nil {
		return inFile(*dir, err)
	}
	if err := os.WriteFile(valuesFile, pinned, 0o644); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if *valuesOut != "" {
		iv := ImageValuesYAML(pins, *version)
		if err := CheckChartValues(iv, pins, *version); err != nil {
			return err
		}
		if err := os.WriteFile(*valuesOut, iv, 0o644); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	fmt.Fprintf(stdout, "%s %s (appVersion %s), images pinned:\n", chartName, chartVersion(*version), *version)
	for _, p := range pins {
		fmt.Fprintf(stdout, "  %s %s\n", p.Key, p.Ref(*version))
	}
	return nil
}

// runChartCheck checks a packaged chart (as helm package wrote it or helm
// pull fetched it) and values files against images.env.
func runChartCheck(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("chart-check", flag.ContinueOnError)
	archive := fs.String("chart", "", "a packaged chart (.tgz): its Chart.yaml and values.yaml are checked")
	valuesFile := fs.String("values", "", "a values file (values-images.yaml) whose image values are checked")
	env := fs.String("images-env", "", "the release's images.env (required)")
	version := fs.String("version", "", "the release's VERSION, e.g. v0.1.0 (required)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *env == "" || *version == "" || (*archive == "" && *valuesFile == "") {
		return usageError{"--images-env, --version and --chart or --values are required"}
	}
	pins, err := readPins(*env, *version)
	if err != nil {
		return err
	}
	if *archive != "" {
		f, err := os.Open(*archive)
		if err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		meta, values, err := ReadChartArchive(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("chart: %s: %w", *archive, err)
		}
		if err := errors.Join(CheckChartMeta(meta, *version), CheckChartValues(values, pins, *version)); err != nil {
			return inFile(*archive, err)
		}
		fmt.Fprintf(stdout, "%s: %s %s (appVersion %s), every image pinned as images.env says\n", *archive, chartName, chartVersion(*version), *version)
	}
	if *valuesFile != "" {
		values, err := readFileMax("values", *valuesFile, maxChartFile)
		if err != nil {
			return err
		}
		if err := CheckChartValues(values, pins, *version); err != nil {
			return inFile(*valuesFile, err)
		}
		fmt.Fprintf(stdout, "%s: every image pinned as images.env says\n", *valuesFile)
	}
	return nil
}

// inFile names the file or chart err is about, its lines indented under it.
func inFile(file string, err error) error {
	return fmt.Errorf("%s:\n  %s", file, strings.ReplaceAll(err.Error(), "\n", "\n  "))
}

// readPins reads images.env and checks the version the images are tagged
// with.
func readPins(env, version string) ([]PinnedImage, error) {
	if !versionRE.MatchString(version) {
		return nil, usageError{fmt.Sprintf("--version %q is not a semantic version with a leading v (v1.2.3, v1.2.3-rc.1)", version)}
	}
	b, err := readFileMax("images.env", env, maxImagesEnv)
	if err != nil {
		return nil, err
	}
	return ParseImagesEnv(b)
}
