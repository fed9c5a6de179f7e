package main

// The release's chart: deploy/chart/compass with each Compass image pinned
// to the digest the release built and pushed, and the NATS image it runs
// (nats.image, which the release does not build) pinned to the digest its
// registry served for the chart's tag at release time. An operator who
// installs the chart from the release's OCI repository, or renders
// manifests with the release's values-images.yaml, runs exactly the images
// whose digests the release published in images.env; a tag alone could be
// moved by whoever can push to the registry, a digest cannot.
//
// values.yaml is the chart's documentation of every value, so the pinning
// edits only the four scalars of each Compass image and the NATS image's
// digest in place and keeps every other byte (comments included); it then
// decodes the result and fails unless it differs from the original in
// exactly those values.

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

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
	// maxImagesEnv bounds images.env: four lines of about 120 bytes.
	maxImagesEnv = 64 << 10
)

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
	env := fs.String("images-env", "", "the release's images.env: RUNNER_IMAGE, CALLOUT_IMAGE, SERVER_IMAGE and NATS_IMAGE by digest (required)")
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

// runChartNATS prints the chart's NATS image as it renders without a
// digest (the name images.env's NATS_IMAGE gives, nats:2.15.2-alpine) and
// where the release reads its digest: the image's own registry, Docker Hub
// for an image without one (docker.io/library/nats:2.15.2-alpine), or with
// --registry the same repository path there (the dry run's loopback
// registry, which has no network).
func runChartNATS(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("chart-nats", flag.ContinueOnError)
	valuesFile := fs.String("values", "", "the chart's values.yaml, e.g. the release commit's deploy/chart/compass/values.yaml (required)")
	registry := fs.String("registry", "", "read the digest from this registry (host[:port]) instead of the image's own, at the same repository path")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *valuesFile == "" {
		return usageError{"--values is required"}
	}
	if *registry != "" {
		if _, err := name.NewRegistry(*registry, name.StrictValidation); err != nil || strings.Contains(*registry, "/") {
			return usageError{fmt.Sprintf("--registry %q is not a registry host[:port]", *registry)}
		}
	}
	b, err := readFileMax("values", *valuesFile, maxChartFile)
	if err != nil {
		return err
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("chart: %s: %w", *valuesFile, err)
	}
	own, err := ChartImage(v, "nats")
	if err != nil {
		return fmt.Errorf("chart: %s: %w", *valuesFile, err)
	}
	n := own.Name("")
	tag, err := name.NewTag(n)
	if err != nil {
		return fmt.Errorf("chart: %s: nats.image %s: %w", *valuesFile, n, err)
	}
	from := tag.RegistryStr()
	switch {
	case *registry != "":
		from = *registry
	case from == name.DefaultRegistry:
		from = "docker.io"
	}
	fmt.Fprintf(stdout, "%s %s/%s:%s\n", n, from, tag.RepositoryStr(), tag.TagStr())
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
