package deploy

import (
	"fmt"
	"strings"
	"sync"

	"github.com/compass-runner/identity/deploy/chart"
)

// The chart (deploy/chart/compass) is the one template source: Render
// renders it with p's values, as helm template would (DL-455).
var loadChart = sync.OnceValues(chart.Load)

// release is the chart's .Release for manifests; the chart names its
// namespaces from values, not from the release.
var release = chart.Release{Name: "compass", Namespace: "compass-system"}

// manifestOrder is the order manifests prints the chart's templates in: each
// namespace before what it holds. TestManifestOrderNamesEveryTemplate keeps
// it whole.
var manifestOrder = []string{
	"runner.yaml", "callout.yaml", "server.yaml", "server-backup-cronjob.yaml",
	"token-review.yaml", "network-policies.yaml", "service-monitors.yaml",
}

// Render validates p and renders the manifests as one multi-document YAML
// stream: the Runner's namespace, admission policy and binding, ServiceAccount
// and DaemonSet; then the callout's namespace, ServiceAccount, nats-server
// ConfigMap, Deployment, PodDisruptionBudget and metrics Service; then, when
// p.NATSImage is set, a nats-server Deployment and Service, or for a cluster
// a StatefulSet, its headless Service, the client Service and a
// PodDisruptionBudget; then, when p.ServerImage is set, the Server
// (ServiceAccount, a Deployment on PostgreSQL or a StatefulSet on SQLite with
// a schema-checking init container, door and metrics Services, a
// PodDisruptionBudget); then, with p.NetworkPolicies, a NetworkPolicy for
// each of the Server, the callout and nats-server; and with
// p.ServiceMonitor, a ServiceMonitor for each metrics Service and a
// PodMonitor for the Runners; with p.PrometheusRule, the alerting rules; with
// p.GrafanaDashboard, the dashboard's ConfigMap. It is the chart
// (deploy/chart/compass) rendered with p.Values().
func Render(p Params) ([]byte, error) {
	return RenderValues(p, nil)
}

// RenderValues is Render with extra chart values laid over p.Values() (a
// values file given to manifests: the chart's settings no flag has, such as
// tolerations). The chart's schema checks the result.
func RenderValues(p Params, extra map[string]any) ([]byte, error) {
	out, err := renderChart(p, extra)
	if err != nil {
		return nil, err
	}
	var buf strings.Builder
	for _, name := range manifestOrder {
		if doc := strings.Trim(out[name], "\n"); doc != "" {
			buf.WriteString(doc + "\n")
		}
	}
	return []byte(buf.String()), nil
}

// RenderMigrateJob validates p and renders only the Server's migrate Job
// (compass-server manifests --migrate-job): compass-server migrate with the
// Server's image and database settings, the deliberate step of an upgrade
// (docs/store.md). It needs p.ServerImage.
func RenderMigrateJob(p Params) ([]byte, error) {
	return RenderMigrateJobValues(p, nil)
}

// RenderMigrateJobValues is RenderMigrateJob with extra chart values laid
// over p.Values(), as RenderValues: the Job takes the Server's tolerations,
// nodeSelector, affinity, priorityClassName and the imagePullSecrets.
func RenderMigrateJobValues(p Params, extra map[string]any) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.ServerImage == "" {
		return nil, fmt.Errorf("%w: --migrate-job: the migrate Job is the Server's: give --server-image (the release to migrate to) and the Server's database flags", ErrInvalidParams)
	}
	job := map[string]any{"server": map[string]any{"migrateJob": true}}
	out, err := renderChart(p, mergeValues(mergeValues(map[string]any{}, extra), job))
	if err != nil {
		return nil, err
	}
	return []byte(strings.Trim(out["server-migrate-job.yaml"], "\n") + "\n"), nil
}

// RenderNATSConfig validates p and renders only the nats-server configuration
// that Render puts in the compass-nats-config ConfigMap.
func RenderNATSConfig(p Params) ([]byte, error) {
	return includeChart(p, "compass.natsConfigOf")
}

// RenderNATSHelmValues validates p and renders values for the official nats
// Helm chart (nats-io/k8s, chart nats, 1.x) that carry the configuration
// RenderNATSConfig renders: client TLS, the monitoring endpoint, the
// accounts, the auth_callout block and, for a cluster, route TLS, the route
// user and the routes, with every secret read from the environment the
// values give the chart's container.
func RenderNATSHelmValues(p Params) ([]byte, error) {
	return includeChart(p, "compass.natsHelmValuesOf")
}

// validChart validates p and returns the loaded chart: what every rendering
// starts with.
func validChart(p Params) (*chart.Chart, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c, err := loadChart()
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	return c, nil
}

func renderChart(p Params, extra map[string]any) (map[string]string, error) {
	c, err := validChart(p)
	if err != nil {
		return nil, err
	}
	out, err := c.Render(mergeValues(p.Values(), extra), release)
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	return out, nil
}

func includeChart(p Params, name string) ([]byte, error) {
	c, err := validChart(p)
	if err != nil {
		return nil, err
	}
	out, err := c.Include(p.Values(), release, name)
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	return []byte(out), nil
}

// mergeValues lays extra over base: maps merge, everything else replaces.
// base is changed; extra never is (its maps are copied into base, so a later
// merge into base leaves them alone).
func mergeValues(base, extra map[string]any) map[string]any {
	for k, v := range extra {
		bm, bok := base[k].(map[string]any)
		em, eok := v.(map[string]any)
		switch {
		case bok && eok:
			base[k] = mergeValues(bm, em)
		case eok:
			base[k] = mergeValues(map[string]any{}, em)
		default:
			base[k] = v
		}
	}
	return base
}
