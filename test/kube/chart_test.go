package kube

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/test/helm"
)

// helmManager is the field manager helm install applies under: Helm v4
// installs with server-side apply, without forcing, as the binary's base
// name.
const helmManager = "helm"

// prometheusRuleCRD is the part of the Prometheus Operator's PrometheusRule
// CRD (monitoring.coreos.com/v1) that the rendering uses, with the
// operator's types, its int-or-string expr and its duration pattern. Like
// monitorCRD it is structural and does not preserve unknown fields, so a
// rendered field outside it is pruned, and the dry run's answer shows it.
const prometheusRuleCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, listKind: PrometheusRuleList, plural: prometheusrules, singular: prometheusrule}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          required: [spec]
          properties:
            apiVersion: {type: string}
            kind: {type: string}
            metadata: {type: object}
            spec:
              type: object
              properties:
                groups:
                  type: array
                  items:
                    type: object
                    required: [name]
                    properties:
                      name: {type: string, minLength: 1}
                      interval: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                      rules:
                        type: array
                        items:
                          type: object
                          required: [expr]
                          properties:
                            alert: {type: string}
                            record: {type: string}
                            expr: {anyOf: [{type: integer}, {type: string}], x-kubernetes-int-or-string: true}
                            for: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                            keep_firing_for: {type: string}
                            labels: {type: object, additionalProperties: {type: string}}
                            annotations: {type: object, additionalProperties: {type: string}}
`

// installPrometheusRuleCRD creates the PrometheusRule CRD and waits until
// discovery serves it.
func (s *apiServer) installPrometheusRuleCRD(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(s.admin)
	if err != nil {
		return fmt.Errorf("test/kube: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(s.admin)
	if err != nil {
		return fmt.Errorf("test/kube: %w", err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(prometheusRuleCRD), &obj); err != nil {
		return fmt.Errorf("test/kube: PrometheusRule CRD: %w", err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("test/kube: create PrometheusRule CRD: %w", err)
	}
	var last error
	err = poll(ctx, func(context.Context) (bool, error) {
		groups, err := restmapper.GetAPIGroupResources(dc)
		if err == nil {
			_, err = restmapper.NewDiscoveryRESTMapper(groups).RESTMapping(schema.GroupKind{Group: "monitoring.coreos.com", Kind: "PrometheusRule"}, "v1")
		}
		last = err
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("test/kube: PrometheusRule CRD never served (%v): %w", last, err)
	}
	return nil
}

// chartValues are the fullest configurations, on PostgreSQL or SQLite
// (serverParams: the Server, a NATS cluster with the monitor on the pod,
// every NetworkPolicy, the ServiceMonitors and the PodMonitor; on SQLite
// the backup CronJob), with the alerting rules, the dashboard and the
// release label kube-prometheus-stack selects by, and the chart's values
// no flag sets on every workload: tolerations, nodeSelector, affinity, pull
// secrets, common labels and annotations, and on SQLite the volume's
// storageClass. The API server checks each against its types.
func chartValues(postgres bool) []map[string]any {
	p := serverParams(postgres)
	p.PrometheusRule, p.GrafanaDashboard = true, true
	p.MonitoringLabels = []string{"release=kube-prometheus-stack"}
	p.CABundleConfigMap = "compass-ca"
	scheduling := map[string]any{
		"tolerations":  []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "compass", "effect": "NoSchedule"}},
		"nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
		"affinity": map[string]any{"nodeAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{
			map[string]any{"weight": 10, "preference": map[string]any{"matchExpressions": []any{
				map[string]any{"key": "node.example.com/pool", "operator": "In", "values": []any{"platform"}}}}}}}},
		"podLabels":      map[string]any{"cost-center": "platform"},
		"podAnnotations": map[string]any{"team.example.com/owner": "platform"},
	}
	server := maps.Clone(scheduling)
	if !postgres {
		server["storage"] = map[string]any{"storageClass": "fast-ssd"}
	}
	extra := map[string]any{
		"imagePullSecrets":  []any{"registry-creds"},
		"imagePullPolicy":   "IfNotPresent",
		"commonLabels":      map[string]any{"team.example.com/owner": "platform"},
		"commonAnnotations": map[string]any{"team.example.com/runbook": "https://runbooks.example.com/compass"},
		"runner":            map[string]any{"tolerations": []any{map[string]any{"operator": "Exists"}}},
		"callout":           scheduling,
		"nats":              scheduling,
		"server":            server,
	}
	return []map[string]any{p.Values(), extra}
}

// TestLiveHelmTemplateApplies: what the pinned helm binary's `helm template`
// prints for the fullest configurations (chartValues, on PostgreSQL and on
// SQLite) is accepted by the API server object by object, as helm install
// would apply it (server-side, as the field manager helm, not forcing) but
// as a dry run: validation, defaulting, the CRDs' schemas and admission,
// with nothing stored. Every rendered field comes back in the dry run's
// answer as rendered (none pruned or changed, the monitors' and the rules'
// included). The Namespaces are applied for real first, since a dry run in
// a namespace that does not exist is refused for that alone. test/helm
// proves helm prints what manifests renders; this proves a cluster takes it.
func TestLiveHelmTemplateApplies(t *testing.T) {
	assets := requireBinaries(t)
	bin := helm.Binary(t)
	c := startUpgradeCluster(t, assets, "helm")
	ctx := t.Context()
	if err := c.installPrometheusRuleCRD(ctx); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.apiServer.admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	c.mapper = restmapper.NewDiscoveryRESTMapper(groups) // the PrometheusRule too

	render := func(postgres bool) []*unstructured.Unstructured {
		t.Helper()
		objs, err := splitManifests(helm.Template(t, bin, helm.ChartDir(t), chartValues(postgres)))
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	pg, sqlite := render(true), render(false)
	for _, tc := range []struct {
		name string
		objs []*unstructured.Unstructured
		want map[string]int
	}{
		{"PostgreSQL", pg, map[string]int{
			"Namespace": 2, "ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2, "DaemonSet": 1,
			"StatefulSet": 1, "Deployment": 2, "PodDisruptionBudget": 3, "NetworkPolicy": 7,
			"ServiceMonitor": 2, "PodMonitor": 1, "PrometheusRule": 1, "CronJob": 0,
		}},
		{"SQLite", sqlite, map[string]int{"StatefulSet": 2, "CronJob": 1, "PrometheusRule": 1}},
	} {
		kinds := map[string]int{}
		for _, u := range tc.objs {
			kinds[u.GetKind()]++
		}
		for k, n := range tc.want {
			if kinds[k] != n {
				t.Errorf("%s: helm template printed %d %s objects, want %d (all: %v)", tc.name, kinds[k], k, n, kinds)
			}
		}
	}
	objs := append(pg, sqlite...)

	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			if _, err := c.apply(ctx, u, helmManager, false, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, u := range objs {
		got, err := c.apply(ctx, u, helmManager, false, true)
		if err != nil {
			t.Errorf("dry run: %v", err)
			continue
		}
		for _, d := range notIn(u.Object, got.Object, "") {
			t.Errorf("%s %s/%s in the dry run's answer: %s", u.GetKind(), u.GetNamespace(), u.GetName(), d)
		}
	}
	// A dry run stores nothing: no workload exists after it.
	for _, u := range objs {
		if !slices.Contains([]string{"Deployment", "StatefulSet", "DaemonSet", "PrometheusRule"}, u.GetKind()) {
			continue
		}
		if _, err := c.get(ctx, u); !apierrors.IsNotFound(err) {
			t.Errorf("%s %s/%s after the dry run: %v, want not found", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
}
