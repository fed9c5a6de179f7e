package deploy

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy/chart"
)

// writeValues writes vals as a YAML values file in a temporary directory.
func writeValues(t *testing.T, name string, vals map[string]any) string {
	t.Helper()
	raw, err := yaml.Marshal(vals)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func runManifests(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := ManifestsCommand(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// manifests --values, end to end: two generated values files, the second
// laid over the first (a map merges, a later file's value wins), print what
// RenderValues prints for the flags and the merged values; the Runner
// DaemonSet carries the first file's tolerations and both files' labels, the
// second's value where both set one; --migrate-job with the same files gives
// the migrate Job the Server's scheduling values.
func TestManifestsValuesFilesLayUnderTheFlags(t *testing.T) {
	r := newRand(t)
	o := genOperatorValues(t, r)
	shared := "team.example.com/" + word(r)
	first, second := word(r), word(r)+"-2"
	firstOnly := map[string]any{"commonLabels": map[string]any{shared: first, "first.example.com/x": "1"}, "runner": o.vals["runner"]}
	secondOnly := map[string]any{"commonLabels": map[string]any{shared: second}, "server": o.vals["server"], "imagePullSecrets": o.vals["imagePullSecrets"]}
	f1, f2 := writeValues(t, "first.yaml", firstOnly), writeValues(t, "second.yaml", secondOnly)

	p := DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	flags := []string{"--cluster-name", p.ClusterName, "--server-url", p.ServerURL, "--server-image", p.ServerImage}
	out, stderr, err := runManifests(t, append(slices.Clone(flags), "--values", f1, "--values", f2)...)
	if err != nil {
		t.Fatalf("manifests: %v (stderr %q)", err, stderr)
	}
	merged := map[string]any{}
	for _, m := range []map[string]any{firstOnly, secondOnly} {
		raw, _ := yaml.Marshal(m) // as read from the file
		var v map[string]any
		if err := yaml.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		merged = mergeValues(merged, v)
	}
	want, err := RenderValues(p, merged)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Fatal("manifests --values differs from RenderValues of the flags and the files' values")
	}
	objs, err := decodeStrict([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	ds := only[*appsv1.DaemonSet](t, objs, p.Namespace, RunnerDaemonSet)
	if ds.Labels[shared] != second || ds.Labels["first.example.com/x"] != "1" {
		t.Fatalf("DaemonSet labels %v: want %s=%s (the later file) and the first file's other label", ds.Labels, shared, second)
	}
	checkEqual(t, "the Runner's tolerations", ds.Spec.Template.Spec.Tolerations, o.pods["runner"].tolerations)
	checkEqual(t, "the Runner's imagePullSecrets", ds.Spec.Template.Spec.ImagePullSecrets, o.pullSecrets)
	if plain, _, err := runManifests(t, flags...); err != nil || plain == out {
		t.Fatalf("without --values: err %v, same output %v", err, plain == out)
	}

	jobOut, stderr, err := runManifests(t, append(slices.Clone(flags), "--migrate-job", "--values", f1, "--values", f2)...)
	if err != nil {
		t.Fatalf("manifests --migrate-job: %v (stderr %q)", err, stderr)
	}
	var job batchv1.Job
	if err := yaml.UnmarshalStrict([]byte(jobOut), &job); err != nil {
		t.Fatal(err)
	}
	spec := job.Spec.Template.Spec
	sv := o.pods["server"]
	checkEqual(t, "the migrate Job's tolerations", spec.Tolerations, sv.tolerations)
	checkEqual(t, "the migrate Job's nodeSelector", spec.NodeSelector, sv.nodeSelector)
	checkEqual(t, "the migrate Job's priorityClassName", spec.PriorityClassName, sv.priorityClass)
	checkEqual(t, "the migrate Job's imagePullSecrets", spec.ImagePullSecrets, o.pullSecrets)
	if job.Labels[shared] != second {
		t.Fatalf("migrate Job labels %v", job.Labels)
	}
}

// nested is a values map setting path (a.b.c) to v.
func nested(path string, v any) map[string]any {
	parts := strings.Split(path, ".")
	out := map[string]any{parts[len(parts)-1]: v}
	for i := len(parts) - 2; i >= 0; i-- {
		out = map[string]any{parts[i]: out}
	}
	return out
}

// A values file cannot set what a flag sets, so it cannot put into the
// manifests a value Validate never saw: every value a flag sets, and any map
// holding one replaced by a scalar or a null, is refused, naming the file,
// the value and the flag, and nothing is printed. So are an unreadable file,
// one that is not a map, --values with --nats-helm-values, and a file whose
// values the chart refuses (naming the file too).
func TestManifestsValuesFileRefusesAFlagsValue(t *testing.T) {
	r := newRand(t)
	flags := []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com"}
	type refusal struct {
		name  string
		vals  map[string]any
		wants []string
	}
	var cases []refusal
	for _, path := range slices.Sorted(maps.Keys(valueFlags)) {
		for kind, v := range map[string]any{"a string": word(r), "null": nil, "a map": map[string]any{word(r): word(r)}} {
			cases = append(cases, refusal{path + " " + kind, nested(path, v), []string{path + " is the value of " + valueFlags[path]}})
		}
	}
	for _, parent := range []string{"namespaces", "token", "policy", "runner", "callout", "nats", "server", "server.storage", "server.backup", "networkPolicies", "monitoring"} {
		cases = append(cases, refusal{parent + " null", nested(parent, nil), []string{parent + " is set by manifests' flags"}},
			refusal{parent + " a list", nested(parent, []any{word(r)}), []string{parent + " is set by manifests' flags"}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := writeValues(t, "values.yaml", tc.vals)
			out, _, err := runManifests(t, append(slices.Clone(flags), "--values", file)...)
			if !errors.Is(err, ErrInvalidParams) || out != "" {
				t.Fatalf("err = %v, output %d bytes; want ErrInvalidParams and nothing printed", err, len(out))
			}
			for _, want := range append(tc.wants, "--values "+file+": ") {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want it to say %q", err, want)
				}
			}
		})
	}

	dir := t.TempDir()
	list := filepath.Join(dir, "list.yaml")
	if err := os.WriteFile(list, []byte("- commonLabels\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := writeValues(t, "good.yaml", map[string]any{"commonLabels": map[string]any{"team": "a"}})
	chartKey := writeValues(t, "chart-key.yaml", map[string]any{"runner": map[string]any{"podLabels": map[string]any{"app.kubernetes.io/name": "compass-server"}}})
	for _, tc := range []struct {
		name string
		args []string
		is   error
		want string
	}{
		{"missing file", []string{"--values", filepath.Join(dir, "none.yaml")}, ErrInvalidParams, "--values " + filepath.Join(dir, "none.yaml") + ": no such file"},
		{"not a map", []string{"--values", list}, ErrInvalidParams, "--values " + list + ": not a YAML map"},
		{"with --nats-helm-values", []string{"--values", good, "--nats-helm-values"}, ErrInvalidParams, "--values sets this chart's values; --nats-helm-values"},
		{"a chart label in podLabels", []string{"--values", good, "--values", chartKey}, chart.ErrInvalidValues, "runner.podLabels: app.kubernetes.io/name is a label the chart sets itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runManifests(t, append(slices.Clone(flags), tc.args...)...)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || out != "" {
				t.Fatalf("err = %v, output %d bytes; want %v saying %q", err, len(out), tc.is, tc.want)
			}
			if errors.Is(tc.is, chart.ErrInvalidValues) && !strings.Contains(err.Error(), "--values "+good+", "+chartKey) {
				t.Fatalf("err = %v, want it to name the files", err)
			}
		})
	}
}

// valueFlags names every value Params.Values sets, each by a flag manifests
// has, and each value it names is one of the chart's (values.yaml): a flag
// added to Values without its entry would leave its value open to a file.
func TestValueFlagsNameEveryFlagValue(t *testing.T) {
	p := DefaultParams()
	p.NATSImage, p.ServerImage, p.MonitoringLabels = NATSImage, "ghcr.io/compass-runner/compass-server:v0.1.0", []string{"a=b"}
	var walk func(m map[string]any, prefix string)
	seen := map[string]bool{}
	walk = func(m map[string]any, prefix string) {
		for k, v := range m {
			path := prefix + k
			if _, ok := valueFlags[path]; ok {
				seen[path] = true
				continue
			}
			sub, ok := v.(map[string]any)
			if !ok {
				t.Errorf("Values sets %s, which valueFlags does not name", path)
				continue
			}
			walk(sub, path+".")
		}
	}
	walk(p.Values(), "")

	fs := flag.NewFlagSet("manifests", flag.ContinueOnError)
	ManifestFlags(fs)
	ManifestsOptionFlags(fs)
	raw, err := chartFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	for path, name := range valueFlags {
		if fs.Lookup(strings.TrimPrefix(name, "--")) == nil {
			t.Errorf("valueFlags[%s] = %s, which manifests does not have", path, name)
		}
		if !seen[path] && path != "server.migrateJob" { // --migrate-job sets it apart from Values
			t.Errorf("valueFlags names %s, which Values does not set", path)
		}
		v := any(defaults)
		for _, part := range strings.Split(path, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				t.Errorf("valueFlags names %s, which values.yaml does not have", path)
				break
			}
			if v, ok = m[part]; !ok {
				t.Errorf("valueFlags names %s, which values.yaml does not have", path)
				break
			}
		}
	}
	// And the flag parses as a repeatable list, in order.
	var files []string
	vf := valuesFlag{&files}
	for _, f := range []string{"a.yaml", "b.yaml", "a.yaml"} {
		if err := vf.Set(f); err != nil {
			t.Fatal(err)
		}
	}
	if vf.String() != "a.yaml,b.yaml,a.yaml" || vf.Set("") == nil {
		t.Fatalf("--values = %q, or an empty name accepted", vf.String())
	}
}
