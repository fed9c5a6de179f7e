package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
)

// monitorCRD is the part of a Prometheus Operator monitor CRD
// (monitoring.coreos.com/v1: ServiceMonitor, PodMonitor) that the rendering
// uses, with the operator's types and the interval's pattern; %[1]s is the
// kind, %[2]s its plural, %[3]s the endpoints field (endpoints,
// podMetricsEndpoints). It is structural and does not preserve unknown
// fields, so the API server prunes any field of a rendered monitor outside
// it: TestLiveServerManifestsApply reads each back and finds it whole.
const monitorCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[2]s.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: %[1]s, listKind: %[1]sList, plural: %[2]s, singular: %[4]s}
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
              required: [selector]
              properties:
                jobLabel: {type: string}
                namespaceSelector:
                  type: object
                  properties:
                    any: {type: boolean}
                    matchNames:
                      type: array
                      items: {type: string}
                selector:
                  type: object
                  properties:
                    matchLabels:
                      type: object
                      additionalProperties: {type: string}
                  x-kubernetes-map-type: atomic
                %[3]s:
                  type: array
                  items:
                    type: object
                    properties:
                      port: {type: string}
                      path: {type: string}
                      interval:
                        type: string
                        pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'
`

// monitorKinds are the monitors the rendering uses, with their endpoints
// field.
var monitorKinds = []struct{ kind, endpoints string }{
	{"ServiceMonitor", "endpoints"},
	{"PodMonitor", "podMetricsEndpoints"},
}

// installMonitorCRDs creates the ServiceMonitor and PodMonitor CRDs and
// waits until each is established and served (discovery lists it).
func (s *apiServer) installMonitorCRDs(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(s.admin)
	if err != nil {
		return fmt.Errorf("test/kube: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(s.admin)
	if err != nil {
		return fmt.Errorf("test/kube: %w", err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, m := range monitorKinds {
		kind, singular := m.kind, strings.ToLower(m.kind)
		var obj map[string]any
		if err := yaml.Unmarshal(fmt.Appendf(nil, monitorCRD, kind, singular+"s", m.endpoints, singular), &obj); err != nil {
			return fmt.Errorf("test/kube: %s CRD: %w", kind, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("test/kube: create %s CRD: %w", kind, err)
		}
		var last string
		err = poll(ctx, func(ctx context.Context) (bool, error) {
			got, err := crds.Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			established := false
			for _, c := range conds {
				m, _ := c.(map[string]any)
				established = established || (m["type"] == "Established" && m["status"] == "True")
			}
			if !established {
				last = "not established"
				return false, nil
			}
			groups, err := restmapper.GetAPIGroupResources(dc)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			_, err = restmapper.NewDiscoveryRESTMapper(groups).RESTMapping(schema.GroupKind{Group: "monitoring.coreos.com", Kind: kind}, "v1")
			if err != nil {
				last = err.Error()
			}
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("test/kube: %s CRD never served (%s): %w", kind, last, err)
		}
	}
	return nil
}

// serverParams renders the live cluster's manifests (the same namespaces and
// cluster name) with the Server, an in-cluster NATS cluster and ServiceMonitors.
func serverParams(postgres bool) deploy.Params {
	p := deploy.DefaultParams()
	p.ClusterName = "live"
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.NATSImage = "nats:2.12.1-alpine"
	p.NATSCluster = true
	p.NATSMonitor = deploy.NATSMonitorPod
	p.ServiceMonitor = true
	p.DoorIngressCIDRs = []string{"198.51.100.0/24"}
	if postgres {
		p.ServerDatabaseSecret = "compass-server-database"
		p.DatabaseCIDR = "10.20.0.0/16"
	} else {
		// The nightly backup CronJob (and its NetworkPolicy): the API server
		// checks the schedule and the pod template.
		p.BackupSchedule, p.BackupClaim = "0 3 * * *", "compass-backups"
	}
	return p
}

// TestLiveServerManifestsApply: the rendering with the Server, NetworkPolicies,
// an in-cluster NATS cluster and ServiceMonitors is accepted by the API server
// (validation, defaulting, admission), on PostgreSQL for real and on SQLite as a
// server-side dry run (both workloads are named compass-server); every object
// then exists, and the ServiceMonitors lost no field to pruning. The Runner's
// namespace and the admission policy are left as the live cluster has them.
func TestLiveServerManifestsApply(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	if err := e.srv.installMonitorCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	notRunner := func(u *unstructured.Unstructured) bool { return !isPolicy(u) && u.GetNamespace() != runnerNS }
	render := func(p deploy.Params) []*unstructured.Unstructured {
		t.Helper()
		data, err := deploy.Render(p)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := splitManifests(data)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	sqlite := render(serverParams(false))
	if err := e.srv.applyManifestsDry(ctx, sqlite, notRunner, true); err != nil {
		t.Fatalf("SQLite rendering, dry run: %v", err)
	}
	objs := render(serverParams(true))
	if err := e.srv.applyManifests(ctx, objs, notRunner); err != nil {
		t.Fatalf("PostgreSQL rendering: %v", err)
	}
	dyn, err := dynamic.NewForConfig(e.srv.admin)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(e.srv.admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	kinds := map[string]int{}
	for _, u := range objs {
		if !notRunner(u) {
			continue
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, u.GetName(), err)
		}
		ri := dynamic.ResourceInterface(dyn.Resource(m.Resource))
		if ns := u.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		got, err := ri.Get(ctx, u.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s %s/%s after apply: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
		kinds[gvk.Kind]++
		if (gvk.Kind == "ServiceMonitor" || gvk.Kind == "PodMonitor") && !reflect.DeepEqual(got.Object["spec"], u.Object["spec"]) {
			t.Errorf("%s %s: stored spec %v, rendered %v (a field was pruned or changed)", gvk.Kind, u.GetName(), got.Object["spec"], u.Object["spec"])
		}
	}
	want := map[string]int{"NetworkPolicy": 5, // the Runner namespace's two are left out
		"ServiceMonitor": 2, "PodMonitor": 1, "StatefulSet": 1, "Deployment": 2, "PodDisruptionBudget": 3}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("%d %s objects exist after apply, want %d (all: %v)", kinds[k], k, n, kinds)
		}
	}
	// The API server kept the Server's workload as rendered: replicas, the
	// schema-checking init container and the probes on the metrics port.
	d, err := e.srv.cs.AppsV1().Deployments("compass-system").Get(ctx, deploy.ServerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkServerDeployment(t, d)
	if _, err := e.srv.cs.AppsV1().StatefulSets("compass-system").Get(ctx, deploy.ServerName, metav1.GetOptions{}); err == nil {
		t.Fatal("the SQLite StatefulSet exists after a dry run")
	}
}

func checkServerDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas != deploy.MinServerReplicas {
		t.Errorf("replicas = %v, want %d", d.Spec.Replicas, deploy.MinServerReplicas)
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Args[0] != "check-schema" {
		b, _ := json.Marshal(spec.InitContainers)
		t.Errorf("init containers = %s, want one running check-schema (docs/store.md: the pod never migrates)", b)
	}
	if len(spec.Containers) != 1 || spec.Containers[0].ReadinessProbe == nil || spec.Containers[0].ReadinessProbe.HTTPGet == nil ||
		spec.Containers[0].ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("server container readiness probe missing")
	}
}
