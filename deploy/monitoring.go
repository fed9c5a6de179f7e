package deploy

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The alerting rules and the Grafana dashboard, as files an operator can also
// load by hand (Prometheus's rule_files, Grafana's import). Render embeds them
// whole in the PrometheusRule and the dashboard ConfigMap.
var (
	//go:embed chart/compass/files/compass-rules.yaml
	rulesYAML string
	//go:embed chart/compass/files/dashboard.json
	dashboardJSON string
)

// Names of the monitoring objects.
const (
	// PrometheusRuleName names the PrometheusRule (in the callout namespace).
	PrometheusRuleName = "compass"
	// DashboardConfigMap names the dashboard's ConfigMap; DashboardKey is its
	// file. The label grafana_dashboard: "1" is what the Grafana sidecar of
	// kube-prometheus-stack loads dashboards by.
	DashboardConfigMap = "compass-dashboard"
	DashboardKey       = "compass.json"
	// MonitorJobLabel is the label whose value the Prometheus Operator makes
	// the job label (spec.jobLabel): every scraped Compass object carries
	// app.kubernetes.io/name, so the job is compass-callout, compass-server or
	// compass-runner, the names the rules and the docs use, whatever the
	// Service is called.
	MonitorJobLabel = "app.kubernetes.io/name"
)

// Rules returns the alerting rules file (deploy/chart/compass/files/compass-rules.yaml).
func Rules() string { return rulesYAML }

// Dashboard returns the Grafana dashboard (deploy/chart/compass/files/dashboard.json).
func Dashboard() string { return dashboardJSON }

// monitoringLabel is one extra label of the monitoring objects.
type monitoringLabel struct{ Key, Value string }

var (
	// labelNameRE is a label key's name part (Kubernetes' qualified name);
	// labelPrefixRE its optional DNS-1123 subdomain prefix.
	labelNameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// labelValueRE is a label value: empty, or as a name part.
	labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

// validMonitoringLabels checks --monitoring-label values ("key=value") and
// returns them sorted by key. A key the manifests set themselves
// (app.kubernetes.io/name, app.kubernetes.io/part-of, grafana_dashboard) is
// refused: the job labels, the selectors and the dashboard's loading hang on
// them.
func validMonitoringLabels(raw []string) ([]monitoringLabel, error) {
	out := make([]monitoringLabel, 0, len(raw))
	for _, kv := range raw {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, paramError("monitoring label", "%q is not key=value", kv)
		}
		name, prefix := k, ""
		if i := strings.LastIndex(k, "/"); i >= 0 {
			prefix, name = k[:i], k[i+1:]
			if len(prefix) > 253 || !labelPrefixRE.MatchString(prefix) {
				return nil, paramError("monitoring label", "key %q: the prefix is not a DNS-1123 subdomain", k)
			}
		}
		if !labelNameRE.MatchString(name) {
			return nil, paramError("monitoring label", "key %q is not a label key", k)
		}
		if !labelValueRE.MatchString(v) {
			return nil, paramError("monitoring label", "value %q of %s is not a label value", v, k)
		}
		if k == "app.kubernetes.io/name" || k == "app.kubernetes.io/part-of" || k == "grafana_dashboard" {
			return nil, paramError("monitoring label", "%s is set by the manifests", k)
		}
		if slices.ContainsFunc(out, func(l monitoringLabel) bool { return l.Key == k }) {
			return nil, paramError("monitoring label", "%s given twice", k)
		}
		out = append(out, monitoringLabel{k, v})
	}
	slices.SortFunc(out, func(a, b monitoringLabel) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// DashboardExpressions returns the PromQL expression of every query of the
// dashboard, in panel order.
func DashboardExpressions() ([]string, error) {
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dashboardJSON), &d); err != nil {
		return nil, fmt.Errorf("deploy: dashboard: %w", err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			out = append(out, t.Expr)
		}
	}
	return out, nil
}

// metricNameRE finds the Compass metric names in PromQL: every metric the
// daemons export starts with compass_, and nothing else in the expressions
// (functions, labels, label values) does. up, which Prometheus makes for
// every target, is the only other metric they use.
var metricNameRE = regexp.MustCompile(`\bcompass_[a-z0-9_]*[a-z0-9]\b`)

// MetricNames returns the distinct Compass metric names, as they appear in
// /metrics (a histogram by its _bucket series), that the alerting rules and
// the dashboard use, sorted.
func MetricNames() ([]string, error) {
	exprs, err := DashboardExpressions()
	if err != nil {
		return nil, err
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Expr string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(rulesYAML), &rules); err != nil {
		return nil, fmt.Errorf("deploy: rules: %w", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	var names []string
	for _, e := range exprs {
		names = append(names, metricNameRE.FindAllString(e, -1)...)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
