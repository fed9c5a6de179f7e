package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// monitoringParams renders the Server and every monitoring object.
func monitoringParams() Params {
	p := sqliteServerParams()
	p.ServiceMonitor, p.PrometheusRule, p.GrafanaDashboard = true, true, true
	return p
}

// The Prometheus Operator makes the job label of a ServiceMonitor's targets
// the Service's name unless jobLabel names a label to take it from. Every
// job the rules and the dashboard select on must be one the rendered
// monitors produce, or the alert never fires.
func TestMonitorsSetTheJobTheRulesUse(t *testing.T) {
	p := monitoringParams()
	objs := rendered(t, p)
	jobs := map[string]bool{}
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || (u.GetKind() != "ServiceMonitor" && u.GetKind() != "PodMonitor") {
			continue
		}
		jl, _, _ := unstructured.NestedString(u.Object, "spec", "jobLabel")
		if jl != MonitorJobLabel {
			t.Fatalf("%s %s: jobLabel %q, want %s", u.GetKind(), u.GetName(), jl, MonitorJobLabel)
		}
		sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
		var targetLabels map[string]string
		switch u.GetKind() {
		case "ServiceMonitor":
			n := 0
			for _, o := range objs {
				if s, ok := o.(*corev1.Service); ok && s.Namespace == u.GetNamespace() && selects(sel, s.Labels) {
					targetLabels = s.Labels
					n++
				}
			}
			if n != 1 {
				t.Fatalf("ServiceMonitor %s selects %d Services, want 1", u.GetName(), n)
			}
		case "PodMonitor":
			ns, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "namespaceSelector", "matchNames")
			if !slices.Equal(ns, []string{p.Namespace}) {
				t.Fatalf("PodMonitor namespaces %v, want [%s]", ns, p.Namespace)
			}
			ds := only[*appsv1.DaemonSet](t, objs, p.Namespace, RunnerDaemonSet)
			if !selects(sel, ds.Spec.Template.Labels) {
				t.Fatalf("PodMonitor selector %v does not select the Runner pods %v", sel, ds.Spec.Template.Labels)
			}
			targetLabels = ds.Spec.Template.Labels
			eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "podMetricsEndpoints")
			port := ""
			if len(eps) == 1 {
				port, _ = eps[0].(map[string]any)["port"].(string)
			}
			if !slices.ContainsFunc(ds.Spec.Template.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == port && port != "" }) {
				t.Fatalf("PodMonitor endpoint port %q is not a port of the Runner container", port)
			}
		}
		job := targetLabels[jl]
		if job == "" {
			t.Fatalf("%s %s: its targets carry no %s", u.GetKind(), u.GetName(), jl)
		}
		jobs[job] = true
	}
	if want := map[string]bool{"compass-callout": true, "compass-server": true, "compass-runner": true}; !reflect.DeepEqual(jobs, want) {
		t.Fatalf("jobs %v, want %v", jobs, want)
	}
	exprs, err := DashboardExpressions()
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, text := range append(exprs, Rules()) {
		for _, m := range jobRE.FindAllStringSubmatch(text, -1) {
			used++
			if !jobs[m[1]] {
				t.Errorf("job=%q is used but no monitor produces it (jobs %v)", m[1], jobs)
			}
		}
	}
	if used == 0 {
		t.Fatal("no job selector found in the rules and the dashboard")
	}
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// monitoringObjects are the rendered objects --monitoring-label labels.
func monitoringObjects(objs []runtime.Object) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, o := range objs {
		switch v := o.(type) {
		case *unstructured.Unstructured:
			out[v.GetKind()+"/"+v.GetName()] = v.GetLabels()
		case *corev1.ConfigMap:
			if v.Name == DashboardConfigMap {
				out["ConfigMap/"+v.Name] = v.Labels
			}
		}
	}
	return out
}

// kube-prometheus-stack's Prometheus selects monitors and rules by its
// release label: --monitoring-label puts it, and any other, on every
// monitoring object, and on nothing else.
func TestMonitoringLabelsOnEveryMonitoringObject(t *testing.T) {
	p := monitoringParams()
	p.MonitoringLabels = []string{"release=kube-prometheus-stack", "example.com/team=platform"}
	objs := rendered(t, p)
	mon := monitoringObjects(objs)
	want := []string{"ConfigMap/" + DashboardConfigMap, "PodMonitor/compass-runner", "PrometheusRule/" + PrometheusRuleName,
		"ServiceMonitor/compass-callout", "ServiceMonitor/" + ServerName}
	var got []string
	for k, labels := range mon {
		got = append(got, k)
		if labels["release"] != "kube-prometheus-stack" || labels["example.com/team"] != "platform" {
			t.Errorf("%s labels %v lack the monitoring labels", k, labels)
		}
		if labels["app.kubernetes.io/part-of"] != "compass" {
			t.Errorf("%s lost its own labels: %v", k, labels)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("monitoring objects %v, want %v", got, want)
	}
	for _, o := range objs {
		if m, ok := o.(interface{ GetLabels() map[string]string }); ok {
			if _, isMon := mon[fmtKind(o)+"/"+o.(interface{ GetName() string }).GetName()]; !isMon && m.GetLabels()["release"] != "" {
				t.Errorf("%s %s carries the monitoring label", fmtKind(o), o.(interface{ GetName() string }).GetName())
			}
		}
	}
}

func TestMonitoringLabelsRefused(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tc := range []struct{ label, want string }{
		{"release", `"release" is not key=value`},
		{"=x", `key "" is not a label key`},
		{"-bad=x", `key "-bad" is not a label key`},
		{long + "=x", `key "` + long + `" is not a label key`},
		{"Example.com/team=x", `key "Example.com/team": the prefix is not a DNS-1123 subdomain`},
		{"release=a b", `value "a b" of release is not a label value`},
		{"release=" + long, `value "` + long + `" of release is not a label value`},
		{"app.kubernetes.io/name=x", "app.kubernetes.io/name is set by the manifests"},
		{"grafana_dashboard=0", "grafana_dashboard is set by the manifests"},
	} {
		t.Run(tc.label, func(t *testing.T) {
			p := monitoringParams()
			p.MonitoringLabels = []string{tc.label}
			_, err := Render(p)
			if !errors.Is(err, ErrInvalidParams) || !strings.HasSuffix(err.Error(), "monitoring label: "+tc.want) {
				t.Fatalf("Render: %v, want ...monitoring label: %s", err, tc.want)
			}
		})
	}
	p := monitoringParams()
	p.MonitoringLabels = []string{"release=a", "release=b"}
	if _, err := Render(p); err == nil || !strings.Contains(err.Error(), "release given twice") {
		t.Fatalf("a label given twice: %v", err)
	}
	// An empty value is a label value.
	p.MonitoringLabels = []string{"release="}
	if _, err := Render(p); err != nil {
		t.Fatalf("an empty value: %v", err)
	}
}

// The PrometheusRule is the rules file, whole: what promtool tests is what
// the Operator loads. The dashboard's ConfigMap holds the dashboard as is.
func TestPrometheusRuleAndDashboardAreTheFiles(t *testing.T) {
	p := monitoringParams()
	objs := rendered(t, p)
	pr := only[*unstructured.Unstructured](t, objs, p.CalloutNamespace, PrometheusRuleName)
	if pr.GetKind() != "PrometheusRule" {
		t.Fatalf("%s is a %s", PrometheusRuleName, pr.GetKind())
	}
	var file map[string]any
	if err := yaml.Unmarshal([]byte(Rules()), &file); err != nil {
		t.Fatal(err)
	}
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if len(groups) == 0 || !reflect.DeepEqual(map[string]any{"groups": groups}, file) {
		t.Fatalf("PrometheusRule spec differs from deploy/chart/compass/files/compass-rules.yaml")
	}
	cm := only[*corev1.ConfigMap](t, objs, p.CalloutNamespace, DashboardConfigMap)
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Fatalf("dashboard ConfigMap labels %v, want grafana_dashboard=1", cm.Labels)
	}
	if got := cm.Data[DashboardKey]; strings.TrimSpace(got) != strings.TrimSpace(Dashboard()) {
		t.Fatalf("dashboard ConfigMap %s differs from deploy/chart/compass/files/dashboard.json", DashboardKey)
	}
	// Off by default, each on its own flag.
	q := sqliteServerParams()
	if n := len(monitoringObjects(rendered(t, q))); n != 0 {
		t.Fatalf("%d monitoring objects rendered by default", n)
	}
}

// ruleTests is the part of a promtool test file this test reads.
type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name       string `yaml:"name"`
		AlertTests []struct {
			AlertName string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// Every alert has a promtool test with series that fire it and one with
// series that must not: an alert tested only firing could fire always.
func TestEveryAlertIsTestedFiringAndNot(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yamlv3.Unmarshal([]byte(Rules()), &rules); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("monitoring", "compass-rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tests ruleTests
	if err := yamlv3.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	if want := []string{"../chart/compass/files/compass-rules.yaml"}; !slices.Equal(tests.RuleFiles, want) {
		t.Fatalf("the tests load %v, want %v (the chart's rules)", tests.RuleFiles, want)
	}
	fires, silent := map[string]int{}, map[string]int{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.AlertName]++
			} else {
				silent[a.AlertName]++
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if fires[r.Alert] == 0 || silent[r.Alert] == 0 {
				t.Errorf("alert %s: %d tests that fire it, %d that must not; want at least one of each", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		}
	}
	if n < 10 {
		t.Fatalf("%d alerts in the rules, want the documented ones", n)
	}
}

// promtoolBinary is the pinned promtool (COMPASS_TEST_PROMTOOL, which
// .ci/test sets to the one .ci/tools.sh installs), or the end of the test:
// it fails under CI and skips otherwise.
func promtoolBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("COMPASS_TEST_PROMTOOL")
	msg := ""
	if path == "" {
		msg = "COMPASS_TEST_PROMTOOL is not set (.ci/test sets it to the promtool .ci/tools.sh installs)"
	} else if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		msg = fmt.Sprintf("COMPASS_TEST_PROMTOOL=%s is not a promtool binary", path)
	}
	if msg != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("deploy: " + msg)
		}
		t.Skip("deploy: " + msg + "; skipped because CI is not true")
	}
	return path
}

func promtool(t *testing.T, bin, dir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// dashboardRules writes exprs as recording rules, the one form promtool
// parses PromQL in without a Prometheus to query.
func dashboardRules(t *testing.T, exprs []string) string {
	t.Helper()
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, e := range exprs {
		rules = append(rules, rule{Record: fmt.Sprintf("compass_dashboard:query_%d", i), Expr: e})
	}
	doc := map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}}
	out, err := yamlv3.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The rules and every dashboard query parse as PromQL (promtool check
// rules), and the rules pass their unit tests (promtool test rules). A query
// that does not parse is caught: the check is shown failing on one.
func TestRulesAndDashboardQueriesParse(t *testing.T) {
	bin := promtoolBinary(t)
	if out, err := promtool(t, bin, "monitoring", "check", "rules", "../chart/compass/files/compass-rules.yaml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := promtool(t, bin, "monitoring", "test", "rules", "compass-rules_test.yaml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	exprs, err := DashboardExpressions()
	if err != nil {
		t.Fatal(err)
	}
	if len(exprs) < 20 {
		t.Fatalf("%d dashboard queries, want every panel's", len(exprs))
	}
	if out, err := promtool(t, bin, ".", "check", "rules", dashboardRules(t, exprs)); err != nil {
		t.Fatalf("a dashboard query does not parse: %v\n%s", err, out)
	}
	broken := append(slices.Clone(exprs), `sum by (le (rate(compass_door_requests_total[5m]))`)
	if out, err := promtool(t, bin, ".", "check", "rules", dashboardRules(t, broken)); err == nil {
		t.Fatalf("promtool accepted a query that does not parse:\n%s", out)
	}
}

// Every metric name the rules and the dashboard use, as MetricNames finds
// them; test/e2e checks each against the daemons' /metrics.
func TestMetricNamesFindsEveryFamily(t *testing.T) {
	names, err := MetricNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"compass_callout_answer_slack_seconds_bucket", "compass_cluster_keys_usable", "compass_door_requests_total",
		"compass_runner_nats_connect_failures_total", "compass_server_runners_enrolled",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("MetricNames lacks %s: %v", want, names)
		}
	}
	for _, n := range names {
		if strings.Contains(n, "{") || strings.HasSuffix(n, "_") || !strings.HasPrefix(n, "compass_") {
			t.Errorf("MetricNames returned %q", n)
		}
	}
}

// jobRE finds the job selectors in PromQL.
var jobRE = regexp.MustCompile(`\bjob\s*=\s*"([^"]*)"`)

// The flags set the monitoring parameters: --monitoring-label repeated, the
// three switches.
func TestManifestsMonitoringFlags(t *testing.T) {
	args := []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443", "--server-image", testServerImage, "--service-monitor", "--prometheus-rule", "--grafana-dashboard",
		"--monitoring-label", "release=kube-prometheus-stack", "--monitoring-label", "team=platform"}
	var stdout, stderr bytes.Buffer
	if err := ManifestsCommand(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("ManifestsCommand: %v (stderr %q)", err, stderr.String())
	}
	p := DefaultParams()
	p.ServerImage = testServerImage
	p.ServiceMonitor, p.PrometheusRule, p.GrafanaDashboard = true, true, true
	p.MonitoringLabels = []string{"release=kube-prometheus-stack", "team=platform"}
	want, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Fatal("ManifestsCommand differs from rendering the same parameters")
	}
	if n := strings.Count(stdout.String(), `"team": "platform"`); n != 5 {
		t.Fatalf("the label is on %d objects, want the 5 monitoring objects", n)
	}
	err = ManifestsCommand(t.Context(), []string{"--monitoring-label", "no-equals"}, &stdout, &stderr)
	if !errors.Is(err, ErrInvalidParams) {
		t.Fatalf("a malformed --monitoring-label: %v", err)
	}
}
