package main

// values.yaml pinned in place: the four scalars of each Compass image and
// the NATS image's digest edited, every other byte kept, and the result
// checked to differ in exactly those.

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// PinChartValues returns the chart's values.yaml with each Compass image's
// registry, repository, tag (the version) and digest set to the release's,
// and the NATS image's digest set to images.env's, every other byte as it
// was. The NATS image keeps the chart's registry, repository and tag, which
// images.env must name: a NATS_IMAGE of another image is refused.
func PinChartValues(values []byte, pins []PinnedImage, version string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("chart: values.yaml: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("chart: values.yaml: not one YAML mapping")
	}
	var before map[string]any
	if err := yaml.Unmarshal(values, &before); err != nil {
		return nil, fmt.Errorf("chart: values.yaml: %w", err)
	}
	for _, p := range pins {
		if !p.chartsOwn() {
			continue
		}
		own, err := ChartImage(before, p.Key)
		if err != nil {
			return nil, fmt.Errorf("chart: values.yaml: %w", err)
		}
		if own.Registry != p.Registry || own.Repository != p.Repository || own.Tag != p.Tag {
			return nil, fmt.Errorf("chart: values.yaml: images.env's %s names %s, not the chart's %s.image %s: the release pins the chart's own image by digest",
				imageVar(p.Key), describeName(p, own, version), p.Key, describeName(own, p, version))
		}
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
		for _, f := range p.setFields() {
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
	var after map[string]any
	if err := yaml.Unmarshal(out.Bytes(), &after); err != nil {
		return nil, fmt.Errorf("chart: values.yaml after pinning does not parse: %w", err)
	}
	for _, p := range pins {
		w, _ := before[p.Key].(map[string]any)
		img, _ := w["image"].(map[string]any)
		if img == nil {
			return nil, fmt.Errorf("chart: values.yaml: %s.image is not a mapping", p.Key)
		}
		want := p.values(version)
		for _, f := range p.setFields() {
			img[f] = want[f]
		}
	}
	if !reflect.DeepEqual(before, after) {
		return nil, errors.New("chart: values.yaml: pinning the images changed more than their values")
	}
	return out.Bytes(), nil
}

// ChartImage is key's image in the decoded values: its registry,
// repository and tag, each a string, the tag not empty. It is for the NATS
// image (nats), which the release pins as the chart names it: what
// images.env's NATS_IMAGE must name.
func ChartImage(values map[string]any, key string) (PinnedImage, error) {
	w, _ := values[key].(map[string]any)
	img, _ := w["image"].(map[string]any)
	if img == nil {
		return PinnedImage{}, fmt.Errorf("%s.image is not a mapping", key)
	}
	p := PinnedImage{Key: key}
	for _, f := range imageFields[:3] {
		s, ok := img[f].(string)
		if !ok {
			return PinnedImage{}, fmt.Errorf("%s.image.%s is %v, not a string", key, f, img[f])
		}
		switch f {
		case "registry":
			p.Registry = s
		case "repository":
			p.Repository = s
		case "tag":
			p.Tag = s
		}
	}
	if p.Tag == "" {
		return PinnedImage{}, fmt.Errorf("%s.image has no tag: the release pins it by the digest of its tag", key)
	}
	return p, nil
}

// imageVar is images.env's variable of the chart's values key.
func imageVar(key string) string {
	for _, c := range chartImages {
		if c.Key == key {
			return c.Var
		}
	}
	return key
}

// describeName is p's name as the chart renders it without a digest and,
// where other's renders the same, the values that differ behind it.
func describeName(p, other PinnedImage, version string) string {
	if p.Name(version) != other.Name(version) {
		return p.Name(version)
	}
	return fmt.Sprintf("%s (registry %q, repository %q, tag %q)", p.Name(version), p.Registry, p.Repository, p.tag(version))
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
