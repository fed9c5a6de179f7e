package main

// images.env's pins: each Compass image the release pushed, by digest, and
// values-images.yaml made from them.

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
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
