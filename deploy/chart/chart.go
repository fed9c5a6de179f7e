// Package chart holds the Compass Helm chart (the compass directory, Helm v4,
// apiVersion v2), the install path, and renders it as `helm template` does,
// so that `compass-server manifests` and Helm print the same objects from
// one template source (docs/designs/DECISIONS.md, DL-455).
//
// The renderer is the part of Helm's engine the chart uses: Go templates with
// Sprig's functions and Helm's own (include, tpl, required, fail, toYaml,
// fromYaml, toJson, fromJson), the chart's values.yaml coalesced under the
// given values, and values.schema.json checked with the JSON Schema library
// Helm v4 uses. It does not link Helm itself, which would bring client-go
// into compass-server for the lookup function the chart never calls.
// test/helm renders the same values with the pinned helm binary and compares.
package chart

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"sigs.k8s.io/yaml"
)

// Name is the chart's name (Chart.yaml); Helm names its templates
// Name + "/templates/<file>".
const Name = "compass"

//go:embed all:compass
var files embed.FS

// FS returns the chart's files, rooted at the chart's directory.
func FS() fs.FS {
	sub, err := fs.Sub(files, Name)
	if err != nil {
		panic(err) // the embedded directory exists: a build error otherwise
	}
	return sub
}

// ErrInvalidValues is wrapped by every error about the values: the schema's,
// and a template's required or fail.
var ErrInvalidValues = errors.New("chart: invalid values")

// Release is what templates read as .Release.
type Release struct {
	Name, Namespace string
}

// Chart is the loaded chart: its metadata, default values, schema and
// templates, parsed once.
type Chart struct {
	name     string // Chart.yaml's name, the templates' prefix
	meta     map[string]any
	defaults map[string]any
	schema   *jsonschema.Schema
	sources  map[string]string // "compass/templates/x.yaml" -> text
	files    Files             // every other file but the three above
}

// Files are the chart's files outside templates/ (but Chart.yaml,
// values.yaml and values.schema.json), which templates read as .Files.
type Files map[string][]byte

// Get returns the file's text, empty when there is none (as Helm's).
func (f Files) Get(name string) string { return string(f[name]) }

// Load reads the embedded chart.
func Load() (*Chart, error) { return LoadFS(FS()) }

// LoadFS reads a chart from fsys, rooted at the chart's directory.
func LoadFS(fsys fs.FS) (*Chart, error) {
	c := &Chart{sources: map[string]string{}, files: Files{}}
	raw, err := fs.ReadFile(fsys, "Chart.yaml")
	if err != nil {
		return nil, fmt.Errorf("chart: %w", err)
	}
	var meta struct {
		APIVersion  string `json:"apiVersion"`
		Name        string `json:"name"`
		Version     string `json:"version"`
		AppVersion  string `json:"appVersion"`
		Description string `json:"description"`
		Type        string `json:"type"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		return nil, fmt.Errorf("chart: Chart.yaml: %w", err)
	}
	c.name = meta.Name
	// The keys of Helm's Metadata struct, which templates read as .Chart.
	c.meta = map[string]any{
		"APIVersion": meta.APIVersion, "Name": meta.Name, "Version": meta.Version,
		"AppVersion": meta.AppVersion, "Description": meta.Description, "Type": meta.Type,
	}
	if raw, err = fs.ReadFile(fsys, "values.yaml"); err != nil {
		return nil, fmt.Errorf("chart: %w", err)
	}
	if c.defaults, err = readValues(raw); err != nil {
		return nil, fmt.Errorf("chart: values.yaml: %w", err)
	}
	if raw, err = fs.ReadFile(fsys, "values.schema.json"); err != nil {
		return nil, fmt.Errorf("chart: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("chart: values.schema.json: %w", err)
	}
	compiler := jsonschema.NewCompiler()
	compiler.UseLoader(jsonschema.SchemeURLLoader{}) // no file or network reference is followed
	if err := compiler.AddResource("file:///values.schema.json", doc); err != nil {
		return nil, fmt.Errorf("chart: values.schema.json: %w", err)
	}
	if c.schema, err = compiler.Compile("file:///values.schema.json"); err != nil {
		return nil, fmt.Errorf("chart: values.schema.json: %w", err)
	}
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(p, "templates/"):
			c.sources[meta.Name+"/"+p] = string(b)
		case p != "Chart.yaml" && p != "values.yaml" && p != "values.schema.json":
			c.files[p] = b
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("chart: templates: %w", err)
	}
	return c, nil
}

// readValues parses YAML values as Helm does (sigs.k8s.io/yaml: numbers are
// float64, as templates see them under helm).
func readValues(raw []byte) (map[string]any, error) {
	vals := map[string]any{}
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		return nil, err
	}
	if vals == nil {
		vals = map[string]any{}
	}
	return vals, nil
}

// Values coalesces vals over the chart's defaults as Helm does (maps merge,
// everything else is replaced, a null deletes the default) and checks the
// result against values.schema.json. vals goes through JSON first, so a Go
// int reaches the templates as the float64 a values file gives Helm.
func (c *Chart) Values(vals map[string]any) (map[string]any, error) {
	raw, err := json.Marshal(vals)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidValues, err)
	}
	user, err := readValues(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidValues, err)
	}
	merged := coalesce(deepCopy(c.defaults), user)
	// The schema sees the values as JSON does.
	var inst any
	if raw, err = json.Marshal(merged); err == nil {
		inst, err = jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidValues, err)
	}
	if err := c.schema.Validate(inst); err != nil {
		return nil, fmt.Errorf("%w: values.schema.json: %s", ErrInvalidValues, schemaMessage(err))
	}
	return merged, nil
}

// schemaMessage is the schema's complaint, one line per violated keyword.
func schemaMessage(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	en := message.NewPrinter(language.English)
	var lines []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			lines = append(lines, fmt.Sprintf("at /%s: %s", strings.Join(e.InstanceLocation, "/"), e.ErrorKind.LocalizedString(en)))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	slices.Sort(lines)
	return strings.Join(slices.Compact(lines), "; ")
}

func coalesce(dst, src map[string]any) map[string]any {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]any)
		dm, dok := dst[k].(map[string]any)
		if sok && dok {
			dst[k] = coalesce(dm, sm)
			continue
		}
		dst[k] = v
	}
	return dst
}

func deepCopy(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			out[k] = deepCopy(v)
		case []any:
			out[k] = slices.Clone(v)
		default:
			out[k] = v
		}
	}
	return out
}

// Render coalesces and checks vals (Values), then executes every template
// whose name does not start with "_" and returns their output by file name
// relative to templates/ ("runner.yaml"), as `helm template` renders them.
func (c *Chart) Render(vals map[string]any, rel Release) (map[string]string, error) {
	top, t, err := c.prepare(vals, rel)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(c.sources)) {
		if strings.HasPrefix(path.Base(name), "_") || path.Base(name) == "NOTES.txt" {
			continue
		}
		top["Template"] = map[string]any{"Name": name, "BasePath": c.name + "/templates"}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, top); err != nil {
			return nil, execError(name, err)
		}
		out[strings.TrimPrefix(name, c.name+"/templates/")] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

// Include coalesces and checks vals, then executes the named template (a
// define) with the chart's top-level object, as {{ include name . }} would.
func (c *Chart) Include(vals map[string]any, rel Release, name string) (string, error) {
	top, t, err := c.prepare(vals, rel)
	if err != nil {
		return "", err
	}
	top["Template"] = map[string]any{"Name": name, "BasePath": c.name + "/templates"}
	var buf strings.Builder
	if err := t.ExecuteTemplate(&buf, name, top); err != nil {
		return "", execError(name, err)
	}
	return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
}

func (c *Chart) prepare(vals map[string]any, rel Release) (map[string]any, *template.Template, error) {
	merged, err := c.Values(vals)
	if err != nil {
		return nil, nil, err
	}
	top := map[string]any{
		"Values": merged,
		"Chart":  c.meta,
		"Release": map[string]any{
			"Name": rel.Name, "Namespace": rel.Namespace,
			"IsUpgrade": false, "IsInstall": true, "Revision": 1, "Service": "Helm",
		},
		"Capabilities": map[string]any{},
		"Files":        c.files,
		"Subcharts":    map[string]any{},
	}
	t := template.New("gotpl").Option("missingkey=zero")
	t.Funcs(funcMap(t))
	for _, name := range slices.Sorted(maps.Keys(c.sources)) {
		if _, err := t.New(name).Parse(c.sources[name]); err != nil {
			return nil, nil, fmt.Errorf("chart: parse %s: %w", name, err)
		}
	}
	return top, t, nil
}

// failMark wraps the message of required and fail, so execError can tell a
// value the chart refused from a template that broke.
const failMark = "\x00compass-values\x00"

func execError(name string, err error) error {
	msg := err.Error()
	if i := strings.Index(msg, failMark); i >= 0 {
		rest := msg[i+len(failMark):]
		if j := strings.Index(rest, failMark); j >= 0 {
			return fmt.Errorf("%w: %s", ErrInvalidValues, rest[:j])
		}
	}
	return fmt.Errorf("chart: render %s: %w", name, err)
}

// funcMap is Helm's: Sprig's text functions without env and expandenv, and
// Helm's own, those the chart may use.
func funcMap(t *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	depth := map[string]int{}
	f["include"] = func(name string, data any) (string, error) {
		// Helm's bound on recursive includes.
		if depth[name] > 1000 {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		depth[name]++
		defer func() { depth[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["required"] = func(msg string, val any) (any, error) {
		if val == nil || val == "" {
			return val, errors.New(failMark + msg + failMark)
		}
		return val, nil
	}
	f["fail"] = func(msg string) (string, error) { return "", errors.New(failMark + msg + failMark) }
	f["toYaml"] = func(v any) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	f["fromYaml"] = func(s string) map[string]any {
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["toJson"] = func(v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromJson"] = func(s string) map[string]any {
		m := map[string]any{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["lookup"] = func(string, string, string, string) (map[string]any, error) { return map[string]any{}, nil }
	return f
}
