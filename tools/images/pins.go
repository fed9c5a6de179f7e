package main

// images.env's pins: each Compass image the release pushed, and the NATS
// image the chart runs, by digest, and values-images.yaml made from them.

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// chartImage is an image the chart runs: images.env's variable, the chart's
// values key and, for a Compass image, the program (the image repository's
// last path element). The NATS image has no program: the release does not
// build it, and pins the chart's own (nats.image) by the digest its
// registry serves.
type chartImage struct{ Var, Key, Program string }

// chartImages are the four, in images.env's order.
var chartImages = []chartImage{
	{"RUNNER_IMAGE", "runner", "compass-runner"},
	{"CALLOUT_IMAGE", "callout", "compass-callout"},
	{"SERVER_IMAGE", "server", "compass-server"},
	{"NATS_IMAGE", "nats", ""},
}

var (
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	// valueRE is what a pinned value may hold: a registry with its port and
	// path, a repository, a tag, a digest. Nothing YAML would read as other
	// than the string in double quotes.
	valueRE = regexp.MustCompile(`^[A-Za-z0-9._:/@-]+$`)
)

// PinnedImage is one image as the release published it: a Compass image it
// built and pushed, or the NATS image of the chart.
type PinnedImage struct {
	Key        string // the chart's values key: runner, callout, server, nats
	Registry   string // host[:port]/namespace, e.g. ghcr.io/compass-runner; empty: none (Docker Hub's)
	Repository string // the program, e.g. compass-runner, or the NATS image's repository, nats
	// Tag is the NATS image's own tag, the chart's (2.15.2-alpine); empty
	// for a Compass image, which is tagged with the release's version.
	Tag    string
	Digest string // sha256:<64 hex>, the image index's (or manifest's) digest
}

// tag is the image's tag in a release of version.
func (p PinnedImage) tag(version string) string {
	if p.Tag != "" {
		return p.Tag
	}
	return version
}

// Name is the image as the chart renders it with tag version and no
// digest: registry/repository:tag, the registry left out when empty.
func (p PinnedImage) Name(version string) string {
	n := p.Repository + ":" + p.tag(version)
	if p.Registry != "" {
		n = p.Registry + "/" + n
	}
	return n
}

// Ref is the image's reference as the chart renders it with tag version.
func (p PinnedImage) Ref(version string) string { return p.Name(version) + "@" + p.Digest }

// values are the chart values that pin the image.
func (p PinnedImage) values(version string) map[string]string {
	return map[string]string{"registry": p.Registry, "repository": p.Repository, "tag": p.tag(version), "digest": p.Digest}
}

// chartsOwn is whether the image is the chart's own, the NATS image: the
// chart keeps its registry, repository and tag, and the pin sets only the
// digest.
func (p PinnedImage) chartsOwn() bool { return p.Tag != "" }

// setFields are the values chart-pin writes: all four of a Compass image;
// the digest alone of the chart's own image (chartsOwn), whose registry,
// repository and tag images.env must name as the chart has them.
func (p PinnedImage) setFields() []string {
	if p.chartsOwn() {
		return []string{"digest"}
	}
	return imageFields
}

// imageFields are the keys of a chart image, in values.yaml's order.
var imageFields = []string{"registry", "repository", "tag", "digest"}

// ParseImagesEnv reads images.env as .ci/release writes it: one line
// VAR=<registry>/<program>@sha256:<hex> for each Compass image and one
// NATS_IMAGE=<the chart's nats image>@sha256:<hex> (nats:2.15.2-alpine@…),
// each exactly once. It returns them in chartImages' order.
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
			errs = append(errs, fmt.Errorf("line %d: %q is not one of %s", i+1, v, imageVars()))
			continue
		}
		if _, dup := byVar[v]; dup {
			errs = append(errs, fmt.Errorf("line %d: %s is given twice", i+1, v))
			continue
		}
		c := chartImages[idx]
		var p PinnedImage
		var err error
		if c.Program != "" {
			p, err = parsePinnedRef(ref, c.Key, c.Program)
		} else {
			p, err = parseTaggedRef(ref, c.Key)
		}
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

// imageVars are images.env's variables, for a message.
func imageVars() string {
	var vs []string
	for _, c := range chartImages {
		vs = append(vs, c.Var)
	}
	return strings.Join(vs[:len(vs)-1], ", ") + " and " + vs[len(vs)-1]
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

// parseTaggedRef reads the NATS image's [<registry>/]<repository>:<tag>@
// sha256:<hex>: the chart's image as it renders without a digest (the
// registry left out when empty), then the digest. The registry is what
// comes before the last slash, as compass-server manifests --nats-image
// splits it; chart-pin holds the three to the chart's nats.image.
func parseTaggedRef(ref, key string) (PinnedImage, error) {
	n, digest, ok := strings.Cut(ref, "@")
	if !ok || !digestRE.MatchString(digest) {
		return PinnedImage{}, fmt.Errorf("%q is not pinned by a sha256 digest (the chart's %s.image, then @sha256:<64 hex>)", ref, key)
	}
	colon, slash := strings.LastIndex(n, ":"), strings.LastIndex(n, "/")
	if colon <= slash || colon == len(n)-1 {
		return PinnedImage{}, fmt.Errorf("%q has no tag: name the chart's %s.image with its tag, then the digest", ref, key)
	}
	if _, err := name.NewTag(n); err != nil {
		return PinnedImage{}, fmt.Errorf("%q: %w", ref, err)
	}
	if _, err := name.NewDigest(ref); err != nil {
		return PinnedImage{}, fmt.Errorf("%q: %w", ref, err)
	}
	p := PinnedImage{Key: key, Repository: n[slash+1 : colon], Tag: n[colon+1:], Digest: digest}
	if slash >= 0 {
		p.Registry = n[:slash]
	}
	for _, v := range []string{p.Registry, p.Repository, p.Tag} {
		if v != "" && !valueRE.MatchString(v) {
			return PinnedImage{}, fmt.Errorf("%q: %q has characters no image reference has", ref, v)
		}
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
	fmt.Fprintf(&b, "# The Compass %s images and the chart's NATS image, each pinned by the\n", version)
	b.WriteString("# digest the release published (images.env), for helm install/upgrade -f\n")
	b.WriteString("# values-images.yaml. server.image is used only where the Server is rendered\n")
	b.WriteString("# (server.enabled), nats.image only where nats-server is (nats.enabled).\n")
	b.WriteString("# compass-server manifests takes the images from images.env as flags instead.\n")
	for _, p := range pins {
		fmt.Fprintf(&b, "%s:\n  image:\n", p.Key)
		want := p.values(version)
		for _, f := range imageFields {
			fmt.Fprintf(&b, "    %s: %q\n", f, want[f])
		}
	}
	return []byte(b.String())
}
