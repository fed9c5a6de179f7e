package chart_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/compass-runner/identity/deploy/chart"
)

// testChart is a chart of the behaviours of Helm's engine the Compass chart
// relies on. The expected outputs below are what helm v4.3.2 prints for the
// same files and values (helm template rel DIR -n ns -f values.yaml).
func testChart(t *testing.T, templates map[string]string) *chart.Chart {
	t.Helper()
	fsys := fstest.MapFS{
		"Chart.yaml": {Data: []byte("apiVersion: v2\nname: probe\nversion: 1.2.3\nappVersion: v9.9.9\n")},
		"values.yaml": {Data: []byte(`
name: probe
big: 1000000
list: [a, b]
nested: {keep: 1, drop: 2, inner: {x: 1}}
`)},
		"values.schema.json": {Data: []byte(`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "name": {"type": "string", "pattern": "^[a-z]+$"},
    "big": {"type": "integer", "maximum": 10000000}
  }
}`)},
		"files/data.txt": {Data: []byte("from a file\n")},
	}
	for name, text := range templates {
		fsys["templates/"+name] = &fstest.MapFile{Data: []byte(text)}
	}
	c, err := chart.LoadFS(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The behaviours of Helm's engine the chart depends on, each pinned: values
// coalesced as Helm does, numbers as Helm's values files give them, partials
// and NOTES.txt not rendered, <no value> removed, .Chart and .Files.
func TestRenderBehavesAsHelmTemplate(t *testing.T) {
	c := testChart(t, map[string]string{
		"_helpers.tpl": `{{- define "probe.name" }}{{ .Values.name }}-{{ .Chart.Name }}{{ end }}`,
		"a.yaml": `name: {{ include "probe.name" . }}
big: {{ .Values.big }}
bigint: {{ int .Values.big }}
list: {{ .Values.list | toJson }}
nested: {{ .Values.nested | toJson }}
missing: {{ .Values.nothing }}
chart: {{ .Chart.Version }} {{ .Chart.AppVersion }}
release: {{ .Release.Name }} {{ .Release.Namespace }} {{ .Release.Service }}
file: {{ .Files.Get "files/data.txt" | trim }}
template: {{ .Template.Name }}
`,
		"NOTES.txt": "not rendered",
	})
	out, err := c.Render(map[string]any{
		"list":   []any{"c"},
		"nested": map[string]any{"drop": nil, "inner": map[string]any{"added": 2}},
	}, chart.Release{Name: "rel", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := out["_helpers.tpl"]; ok || len(out) != 1 {
		t.Fatalf("rendered %d files: %v; want a.yaml alone", len(out), slices.Sorted(maps.Keys(out)))
	}
	want := `name: probe-probe
big: 1e+06
bigint: 1000000
list: ["c"]
nested: {"inner":{"added":2,"x":1},"keep":1}
missing: 
chart: 1.2.3 v9.9.9
release: rel ns Helm
file: from a file
template: probe/templates/a.yaml
`
	if got := out["a.yaml"]; got != want {
		t.Fatalf("a.yaml:\n%s\nwant:\n%s", got, want)
	}
}

// A value the schema refuses, a required value left out and a template's
// fail are the caller's mistakes (ErrInvalidValues, with the message); a
// template that does not parse is the chart's.
func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name      string
		templates map[string]string
		values    map[string]any
		invalid   bool
		want      string
	}{
		{"schema pattern", map[string]string{"a.yaml": "x"}, map[string]any{"name": "Bad"}, true,
			"chart: invalid values: values.schema.json: at /name: "},
		{"schema type", map[string]string{"a.yaml": "x"}, map[string]any{"big": "many"}, true,
			"chart: invalid values: values.schema.json: at /big: "},
		{"schema maximum", map[string]string{"a.yaml": "x"}, map[string]any{"big": 20000000}, true,
			"chart: invalid values: values.schema.json: at /big: "},
		{"required", map[string]string{"a.yaml": `{{ required "zone is required: the zone to run in" .Values.zone }}`}, nil, true,
			"chart: invalid values: zone is required: the zone to run in"},
		{"fail", map[string]string{"a.yaml": `{{ fail "name and zone: pick one" }}`}, nil, true,
			"chart: invalid values: name and zone: pick one"},
		{"parse error", map[string]string{"a.yaml": `{{ .Values.name `}, nil, false,
			"chart: parse probe/templates/a.yaml: "},
		{"unknown function", map[string]string{"a.yaml": `{{ env "HOME" }}`}, nil, false,
			"chart: parse probe/templates/a.yaml: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testChart(t, tt.templates)
			out, err := c.Render(tt.values, chart.Release{Name: "rel", Namespace: "ns"})
			if err == nil {
				t.Fatalf("rendered %v", out)
			}
			if errors.Is(err, chart.ErrInvalidValues) != tt.invalid {
				t.Fatalf("errors.Is(%v, ErrInvalidValues) = %v, want %v", err, !tt.invalid, tt.invalid)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("err = %q, want prefix %q", err, tt.want)
			}
		})
	}
}

// env and expandenv are left out as Helm leaves them out: a chart reads
// nothing from the environment of whoever renders it.
func TestRenderHasNoEnvironment(t *testing.T) {
	c := testChart(t, map[string]string{"a.yaml": `{{ expandenv "$HOME" }}`})
	if _, err := c.Render(nil, chart.Release{}); err == nil || !strings.Contains(err.Error(), `function "expandenv" not defined`) {
		t.Fatalf("expandenv: %v", err)
	}
}

// An include that never ends is cut off, as Helm's is.
func TestRenderBoundsRecursiveIncludes(t *testing.T) {
	c := testChart(t, map[string]string{
		"_loop.tpl": `{{- define "loop" }}{{ include "loop" . }}{{ end }}`,
		"a.yaml":    `{{ include "loop" . }}`,
	})
	_, err := c.Render(nil, chart.Release{})
	if err == nil || !strings.Contains(err.Error(), "rendering template has a nested reference name: loop") {
		t.Fatalf("recursive include: %v", err)
	}
}

// The Compass chart, rendered as manifests renders it: deploy.Render does
// this with the values of its flags.
func Example() {
	c, err := chart.Load()
	if err != nil {
		panic(err)
	}
	out, err := c.Render(map[string]any{
		"clusterName": "prod-eks",
		"serverURL":   "https://compass.example.com:8443",
	}, chart.Release{Name: "compass", Namespace: "compass-system"})
	if err != nil {
		panic(err)
	}
	fmt.Println(strings.Contains(out["runner.yaml"], `compass-runner.io/cluster-name: "prod-eks"`))
	// Output: true
}
