package deploy

// The chart's operator values (the ones no flag of manifests sets):
// commonLabels and commonAnnotations, per workload resources, tolerations,
// nodeSelector, affinity, priorityClassName, podLabels and podAnnotations,
// imagePullPolicy, imagePullSecrets and the SQLite volume's storageClass.
// Each test generates its values, renders them through RenderValues (what
// manifests --values and helm -f both lay over the flags' values) and reads
// the decoded objects back.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy/chart"
)

// workloadValues are one workload's generated pod values, typed as the
// decoded objects will carry them.
type workloadValues struct {
	labels, annotations, nodeSelector map[string]string
	tolerations                       []corev1.Toleration
	affinity                          *corev1.Affinity
	priorityClass                     string
	resources                         corev1.ResourceRequirements
	reloader                          corev1.ResourceRequirements // nats only
}

// operatorValues are generated operator values: the chart values (vals) and
// what each should render as.
type operatorValues struct {
	vals              map[string]any
	common, commonAnn map[string]string
	pods              map[string]workloadValues // runner, callout, nats, server
	pullPolicy        corev1.PullPolicy
	pullSecrets       []corev1.LocalObjectReference
	storageClass      string
	// a commonLabels key the runner's podLabels set too, with both values
	sharedKey, sharedCommon, podWins string
}

// newRand is a generator whose seed the test logs, to replay a failure.
func newRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed>>7))
}

func word(r *rand.Rand) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 3+r.IntN(6))
	for i := range b {
		b[i] = letters[r.IntN(len(letters))]
	}
	return string(b)
}

// pairs is n generated key: value pairs, keys under a domain of prefix.
func pairs(r *rand.Rand, prefix string) map[string]string {
	m := map[string]string{}
	for range 1 + r.IntN(3) {
		m[prefix+".example.com/"+word(r)] = word(r)
	}
	return m
}

func genResources(r *rand.Rand) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(fmt.Sprintf("%dm", 1+r.IntN(2000))),
			corev1.ResourceMemory: resource.MustParse(fmt.Sprintf("%dMi", 1+r.IntN(4096))),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse(fmt.Sprintf("%dMi", 4097+r.IntN(4096))),
		},
	}
}

// nodeAffinity is a required node affinity on a generated label.
func nodeAffinity(r *rand.Rand) *corev1.NodeAffinity {
	return &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "node.example.com/" + word(r), Operator: corev1.NodeSelectorOpIn, Values: []string{word(r), word(r)}},
		}}},
	}}
}

// asValue is v as a values file gives it to the chart: through JSON.
func asValue(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// genOperatorValues generates a value for every operator value. Each
// workload's affinity is a node affinity only, so the chart's own terms stay
// beside it (TestValuesAffinityTermsSitBesideTheChartsOwn covers the rest).
func genOperatorValues(t *testing.T, r *rand.Rand) operatorValues {
	t.Helper()
	o := operatorValues{
		common:       pairs(r, "common"),
		commonAnn:    pairs(r, "note"),
		pods:         map[string]workloadValues{},
		pullPolicy:   []corev1.PullPolicy{corev1.PullAlways, corev1.PullNever, corev1.PullIfNotPresent}[r.IntN(3)],
		storageClass: word(r) + "-ssd",
	}
	for range 1 + r.IntN(2) {
		o.pullSecrets = append(o.pullSecrets, corev1.LocalObjectReference{Name: "pull-" + word(r)})
	}
	// One key in both commonLabels and the runner's podLabels: the pod's wins
	// on the pod, the common one everywhere else.
	o.sharedKey, o.sharedCommon, o.podWins = "shared.example.com/"+word(r), "common-"+word(r), "pod-"+word(r)
	o.common[o.sharedKey] = o.sharedCommon
	secrets := []any{}
	for _, s := range o.pullSecrets {
		secrets = append(secrets, s.Name)
	}
	o.vals = map[string]any{
		"commonLabels":      asValue(t, o.common),
		"commonAnnotations": asValue(t, o.commonAnn),
		"imagePullPolicy":   string(o.pullPolicy),
		"imagePullSecrets":  secrets,
		"server":            map[string]any{"storage": map[string]any{"storageClass": o.storageClass}},
	}
	for _, w := range []string{"runner", "callout", "nats", "server"} {
		wv := workloadValues{
			labels:        pairs(r, w+"-pod"),
			annotations:   pairs(r, w+"-note"),
			nodeSelector:  pairs(r, w+"-node"),
			tolerations:   []corev1.Toleration{{Key: "taint.example.com/" + word(r), Operator: corev1.TolerationOpEqual, Value: word(r), Effect: corev1.TaintEffectNoSchedule}},
			affinity:      &corev1.Affinity{NodeAffinity: nodeAffinity(r)},
			priorityClass: w + "-" + word(r),
			resources:     genResources(r),
			reloader:      genResources(r),
		}
		if w == "runner" {
			wv.labels[o.sharedKey] = o.podWins
		}
		v := map[string]any{
			"podLabels":      asValue(t, wv.labels),
			"podAnnotations": asValue(t, wv.annotations),
			"nodeSelector":   asValue(t, wv.nodeSelector),
			"tolerations":    asValue(t, wv.tolerations),
			"affinity":       asValue(t, wv.affinity),
			"resources":      asValue(t, wv.resources),
		}
		if w != "runner" { // the Runner's is --priority-class
			v["priorityClassName"] = wv.priorityClass
		}
		if w == "nats" {
			v["reloaderResources"] = asValue(t, wv.reloader)
		}
		o.pods[w] = wv
		if w == "server" {
			maps.Copy(o.vals["server"].(map[string]any), v)
		} else {
			o.vals[w] = v
		}
	}
	return o
}

// valuesTopologies are the renderings the operator values are checked on:
// every workload the chart renders, the callout in its own Deployment or in
// the Server's pod.
func valuesTopologies() []struct {
	name string
	p    Params
} {
	sqlite := DefaultParams()
	sqlite.NATSImage, sqlite.NATSCluster = NATSImage, true
	sqlite.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	sqlite.BackupSchedule, sqlite.BackupClaim = "0 3 * * *", "compass-backups"
	sqlite.ServiceMonitor, sqlite.PrometheusRule, sqlite.GrafanaDashboard = true, true, true
	sqlite.MonitoringLabels = []string{"release=kube-prometheus-stack"}
	postgres := DefaultParams()
	postgres.NATSImage = NATSImage
	postgres.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	postgres.ServerDatabaseSecret, postgres.DatabaseCIDR = "compass-db", "10.20.0.0/16"
	postgres.ServiceMonitor = true
	return []struct {
		name string
		p    Params
	}{{"Server on SQLite, NATS cluster, backup, monitoring", sqlite}, {"Server on PostgreSQL, one NATS server", postgres}}
}

// renderValues renders p with vals laid over its values and decodes every
// object strictly; the migrate Job, rendered apart, is appended when p has
// the Server.
func renderValues(t *testing.T, p Params, vals map[string]any) []runtime.Object {
	t.Helper()
	out, err := RenderValues(p, vals)
	if err != nil {
		t.Fatalf("RenderValues: %v", err)
	}
	objs, err := decodeStrict(out)
	if err != nil {
		t.Fatalf("strict decode: %v", err)
	}
	if p.ServerImage != "" {
		out, err := RenderMigrateJobValues(p, vals)
		if err != nil {
			t.Fatalf("RenderMigrateJobValues: %v", err)
		}
		var job batchv1.Job
		if err := yaml.UnmarshalStrict(out, &job); err != nil {
			t.Fatalf("migrate Job: %v", err)
		}
		objs = append(objs, &job)
	}
	return objs
}

func objKey(o runtime.Object) string {
	m, err := meta.Accessor(o)
	if err != nil {
		panic(err)
	}
	return o.GetObjectKind().GroupVersionKind().Kind + " " + m.GetNamespace() + "/" + m.GetName()
}

func byKey(objs []runtime.Object) map[string]runtime.Object {
	out := map[string]runtime.Object{}
	for _, o := range objs {
		out[objKey(o)] = o
	}
	return out
}

// podTemplate is o's pod template, nil for an object that has none.
func podTemplateOf(o runtime.Object) *corev1.PodTemplateSpec {
	switch v := o.(type) {
	case *appsv1.DaemonSet:
		return &v.Spec.Template
	case *appsv1.Deployment:
		return &v.Spec.Template
	case *appsv1.StatefulSet:
		return &v.Spec.Template
	case *batchv1.CronJob:
		return &v.Spec.JobTemplate.Spec.Template
	case *batchv1.Job:
		return &v.Spec.Template
	}
	return nil
}

func podNamed(t *testing.T, objs map[string]runtime.Object, key string) *corev1.PodTemplateSpec {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("no %s rendered", key)
	}
	return podTemplateOf(o)
}

func podContainer(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// withAll is base with every pair of extra added (extra winning).
func withAll(base map[string]string, extra ...map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	for _, e := range extra {
		maps.Copy(out, e)
	}
	return out
}

func checkEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}

// Every operator value reaches every object and pod it is for, and only
// those: the common labels and annotations on each object's metadata beside
// the chart's own, unchanged; each workload's scheduling, resources, pod
// labels and annotations on its pods; the Server's scheduling on the backup
// CronJob's and the migrate Job's pods, which keep their own resources and
// the chart's podAffinity toward the Server; the callout container keeping
// the callout's resources inside the Server's pod; the pull policy on every
// container, the pull Secrets on every pod; the SQLite volume's class.
func TestOperatorValuesReachEveryObjectAndPod(t *testing.T) {
	r := newRand(t)
	for _, tc := range valuesTopologies() {
		t.Run(tc.name, func(t *testing.T) {
			o := genOperatorValues(t, r)
			p := tc.p
			p.PriorityClassName = o.pods["runner"].priorityClass
			objs := renderValues(t, p, o.vals)
			plain := byKey(renderValues(t, p, nil))
			got := byKey(objs)
			if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(plain))) {
				t.Fatalf("objects %v, without the values %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(plain)))
			}

			// Metadata: every object, the chart's labels and annotations kept.
			for key, obj := range got {
				m, _ := meta.Accessor(obj)
				pm, _ := meta.Accessor(plain[key])
				checkEqual(t, key+" labels", m.GetLabels(), withAll(pm.GetLabels(), o.common))
				checkEqual(t, key+" annotations", m.GetAnnotations(), withAll(pm.GetAnnotations(), o.commonAnn))
			}

			// Pods: which workload's values each pod template carries.
			ns := p.CalloutNamespace
			pods := map[string]string{
				"DaemonSet " + p.Namespace + "/" + RunnerDaemonSet: "runner",
				"Job " + ns + "/" + ServerMigrateJob:               "job",
			}
			if p.BackupSchedule != "" {
				pods["CronJob "+ns+"/"+ServerBackupCronJob] = "job"
			}
			if p.NATSCluster {
				pods["StatefulSet "+ns+"/nats"] = "nats"
			} else {
				pods["Deployment "+ns+"/nats"] = "nats"
			}
			if p.ServerDatabaseSecret == "" {
				pods["StatefulSet "+ns+"/"+ServerName] = "server"
			} else {
				pods["Deployment "+ns+"/"+ServerName] = "server"
				pods["Deployment "+ns+"/compass-callout"] = "callout"
			}
			templates := 0
			for key, obj := range got {
				if podTemplateOf(obj) != nil {
					templates++
					if _, ok := pods[key]; !ok {
						t.Errorf("%s: a pod template this test does not check", key)
					}
				}
			}
			if templates != len(pods) {
				t.Errorf("%d pod templates rendered, want %d", templates, len(pods))
			}
			for key, w := range pods {
				pod, plainPod := podNamed(t, got, key), podNamed(t, plain, key)
				spec := pod.Spec
				sched := w
				if w == "job" {
					sched = "server"
				}
				wv := o.pods[sched]
				checkEqual(t, key+" priorityClassName", spec.PriorityClassName, wv.priorityClass)
				checkEqual(t, key+" nodeSelector", spec.NodeSelector, wv.nodeSelector)
				checkEqual(t, key+" tolerations", spec.Tolerations, wv.tolerations)
				checkEqual(t, key+" imagePullSecrets", spec.ImagePullSecrets, o.pullSecrets)
				for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
					checkEqual(t, key+" container "+c.Name+" imagePullPolicy", c.ImagePullPolicy, o.pullPolicy)
				}
				// The values' node affinity, beside the chart's own terms.
				want := corev1.Affinity{NodeAffinity: wv.affinity.NodeAffinity}
				if plainPod.Spec.Affinity != nil {
					want.PodAffinity, want.PodAntiAffinity = plainPod.Spec.Affinity.PodAffinity, plainPod.Spec.Affinity.PodAntiAffinity
				}
				checkEqual(t, key+" affinity", spec.Affinity, &want)
				if w == "job" {
					// Common labels, not the Server's podLabels; no annotations.
					checkEqual(t, key+" pod labels", pod.Labels, withAll(plainPod.Labels, o.common))
					checkEqual(t, key+" pod annotations", pod.Annotations, map[string]string(nil))
					for _, c := range spec.Containers {
						checkEqual(t, key+" container "+c.Name+" resources", c.Resources, podContainer(t, plainPod.Spec, c.Name).Resources)
					}
					continue
				}
				checkEqual(t, key+" pod labels", pod.Labels, withAll(plainPod.Labels, o.common, wv.labels))
				checkEqual(t, key+" pod annotations", pod.Annotations, wv.annotations)
				switch w {
				case "runner":
					checkEqual(t, key+" runner resources", podContainer(t, spec, "runner").Resources, wv.resources)
					if pod.Labels[o.sharedKey] != o.podWins {
						t.Errorf("%s: pod label %s = %q, want the podLabels' %q over the commonLabels'", key, o.sharedKey, pod.Labels[o.sharedKey], o.podWins)
					}
				case "callout":
					checkEqual(t, key+" callout resources", podContainer(t, spec, "callout").Resources, wv.resources)
				case "nats":
					checkEqual(t, key+" nats resources", podContainer(t, spec, "nats").Resources, wv.resources)
					checkEqual(t, key+" reloader resources", podContainer(t, spec, "reloader").Resources, wv.reloader)
				case "server":
					checkEqual(t, key+" server resources", podContainer(t, spec, "server").Resources, wv.resources)
					checkEqual(t, key+" check-schema resources", podContainer(t, spec, "check-schema").Resources, podContainer(t, plainPod.Spec, "check-schema").Resources)
					if p.ServerDatabaseSecret == "" {
						// The callout beside the Server keeps the callout's resources.
						checkEqual(t, key+" callout resources", podContainer(t, spec, "callout").Resources, o.pods["callout"].resources)
					}
				}
			}
			if p.ServerDatabaseSecret == "" {
				sts := got["StatefulSet "+ns+"/"+ServerName].(*appsv1.StatefulSet)
				if len(sts.Spec.VolumeClaimTemplates) != 1 {
					t.Fatalf("%d volumeClaimTemplates", len(sts.Spec.VolumeClaimTemplates))
				}
				vct := sts.Spec.VolumeClaimTemplates[0]
				checkEqual(t, "the SQLite volume's storageClassName", vct.Spec.StorageClassName, &o.storageClass)
				// A claim template cannot change on a live StatefulSet: the
				// common labels stay off it, so adding one later still applies.
				checkEqual(t, "the SQLite volume's labels", vct.Labels, plain["StatefulSet "+ns+"/"+ServerName].(*appsv1.StatefulSet).Spec.VolumeClaimTemplates[0].Labels)
			}
		})
	}
}

// selection is what one selector of a rendering selects: the keys of the
// objects (pod templates, Services or Namespaces) whose labels it matches.
func selections(t *testing.T, objs []runtime.Object) map[string][]string {
	t.Helper()
	pods, services, namespaces := map[string]map[string]string{}, map[string]map[string]string{}, map[string]map[string]string{}
	for _, o := range objs {
		if pt := podTemplateOf(o); pt != nil {
			pods[objKey(o)] = pt.Labels
		}
		switch v := o.(type) {
		case *corev1.Service:
			services[objKey(o)] = v.Labels
		case *corev1.Namespace:
			namespaces[objKey(o)] = v.Labels
		}
	}
	match := func(sel map[string]string, among map[string]map[string]string) []string {
		var out []string
		for key, labels := range among {
			ok := true
			for k, v := range sel {
				ok = ok && labels[k] == v
			}
			if ok {
				out = append(out, key)
			}
		}
		slices.Sort(out)
		return out
	}
	out := map[string][]string{}
	add := func(what string, sel map[string]string, among map[string]map[string]string) {
		out[what] = match(sel, among)
	}
	for _, o := range objs {
		key := objKey(o)
		switch v := o.(type) {
		case *appsv1.DaemonSet:
			add(key+" selector", v.Spec.Selector.MatchLabels, pods)
		case *appsv1.Deployment:
			add(key+" selector", v.Spec.Selector.MatchLabels, pods)
		case *appsv1.StatefulSet:
			add(key+" selector", v.Spec.Selector.MatchLabels, pods)
		case *corev1.Service:
			add(key+" selector", v.Spec.Selector, pods)
		case *policyv1.PodDisruptionBudget:
			add(key+" selector", v.Spec.Selector.MatchLabels, pods)
		case *networkingv1.NetworkPolicy:
			add(key+" podSelector", v.Spec.PodSelector.MatchLabels, pods)
			var peers []networkingv1.NetworkPolicyPeer
			for _, in := range v.Spec.Ingress {
				peers = append(peers, in.From...)
			}
			for _, e := range v.Spec.Egress {
				peers = append(peers, e.To...)
			}
			for i, peer := range peers {
				if peer.PodSelector != nil {
					add(fmt.Sprintf("%s peer %d pods", key, i), peer.PodSelector.MatchLabels, pods)
				}
				if peer.NamespaceSelector != nil {
					add(fmt.Sprintf("%s peer %d namespaces", key, i), peer.NamespaceSelector.MatchLabels, namespaces)
				}
			}
		case *unstructured.Unstructured:
			sel, _, _ := unstructured.NestedStringMap(v.Object, "spec", "selector", "matchLabels")
			if v.GetKind() == "PodMonitor" {
				add(key+" selector", sel, pods)
			} else if v.GetKind() == "ServiceMonitor" {
				add(key+" selector", sel, services)
			}
		}
	}
	return out
}

// Labels never break a selector: with generated common labels and pod
// labels, every selector of the rendering (workloads, Services,
// PodDisruptionBudgets, NetworkPolicies and their peers, the monitors)
// selects exactly the pods, Services and Namespaces it selects without them,
// and each workload still selects its own pods.
func TestOperatorLabelsNeverChangeWhatASelectorSelects(t *testing.T) {
	r := newRand(t)
	for _, tc := range valuesTopologies() {
		t.Run(tc.name, func(t *testing.T) {
			o := genOperatorValues(t, r)
			want := selections(t, renderValues(t, tc.p, nil))
			got := selections(t, renderValues(t, tc.p, o.vals))
			if len(want) == 0 {
				t.Fatal("no selector found")
			}
			for what, w := range want {
				if !slices.Equal(got[what], w) {
					t.Errorf("%s selects %v with the values, %v without", what, got[what], w)
				}
				if strings.HasSuffix(what, " selector") && !strings.HasPrefix(what, "Service ") && !strings.Contains(what, "Monitor ") && !strings.HasPrefix(what, "PodDisruptionBudget ") {
					owner := strings.TrimSuffix(what, " selector")
					if !slices.Equal(got[what], []string{owner}) {
						t.Errorf("%s selects %v, want its own pods only", what, got[what])
					}
				}
			}
		})
	}
}

// A values' affinity term sits beside the chart's own: it replaces the
// chart's term of the same kind on the workloads whose term is a preference
// (the callout's, nats-server's and the Server's spreading podAntiAffinity),
// and never the backup's and the SQLite migrate Job's podAffinity toward the
// Server, which must run on the node holding its volume: there the Server's
// podAffinity is left out. On PostgreSQL the migrate Job takes the Server's
// affinity whole.
func TestValuesAffinityTermsSitBesideTheChartsOwn(t *testing.T) {
	r := newRand(t)
	for _, tc := range valuesTopologies() {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			ns := p.CalloutNamespace
			term := func() []corev1.WeightedPodAffinityTerm {
				return []corev1.WeightedPodAffinityTerm{{Weight: int32(1 + r.IntN(100)), PodAffinityTerm: corev1.PodAffinityTerm{
					TopologyKey:   "topology.example.com/" + word(r),
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.example.com/" + word(r): word(r)}}}}}
			}
			aff := map[string]*corev1.Affinity{}
			vals := map[string]any{}
			for _, w := range []string{"callout", "nats", "server"} {
				aff[w] = &corev1.Affinity{
					NodeAffinity:    nodeAffinity(r),
					PodAffinity:     &corev1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: term()},
					PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: term()},
				}
				vals[w] = map[string]any{"affinity": asValue(t, aff[w])}
			}
			got := byKey(renderValues(t, p, vals))
			plain := byKey(renderValues(t, p, nil))
			natsKey := "Deployment " + ns + "/nats"
			if p.NATSCluster {
				natsKey = "StatefulSet " + ns + "/nats"
			}
			serverKey := "StatefulSet " + ns + "/" + ServerName
			if p.ServerDatabaseSecret != "" {
				serverKey = "Deployment " + ns + "/" + ServerName
			}
			checks := map[string]*corev1.Affinity{natsKey: aff["nats"], serverKey: aff["server"]}
			if p.ServerDatabaseSecret != "" {
				checks["Deployment "+ns+"/compass-callout"] = aff["callout"]
			}
			for key, want := range checks {
				checkEqual(t, key+" affinity (the values' terms replacing the chart's)", podNamed(t, got, key).Spec.Affinity, want)
			}
			jobs := []string{"Job " + ns + "/" + ServerMigrateJob}
			if p.BackupSchedule != "" {
				jobs = append(jobs, "CronJob "+ns+"/"+ServerBackupCronJob)
			}
			for _, key := range jobs {
				want := *aff["server"]
				if p.ServerDatabaseSecret == "" {
					chartOwn := podNamed(t, plain, key).Spec.Affinity
					if chartOwn == nil || chartOwn.PodAffinity == nil {
						t.Fatalf("%s: no podAffinity toward the Server without values", key)
					}
					want.PodAffinity = chartOwn.PodAffinity
				}
				checkEqual(t, key+" affinity", podNamed(t, got, key).Spec.Affinity, &want)
			}
		})
	}
}

// Keys the chart sets itself are refused in the operator's labels and
// annotations, naming the value and the key, and never rendered: the chart's
// selector labels (a pod labelled app.kubernetes.io/name: compass-server
// would receive the door's traffic), the namespaces' Pod Security labels,
// the project's own compass-runner.io/ keys, and a monitoring label given
// again. Keys beside them render.
func TestChartsOwnKeysAreRefusedInOperatorMetadata(t *testing.T) {
	r := newRand(t)
	p := valuesTopologies()[0].p
	labelValues := []string{"commonLabels", "runner.podLabels", "callout.podLabels", "nats.podLabels", "server.podLabels"}
	annotationValues := []string{"commonAnnotations", "runner.podAnnotations", "callout.podAnnotations", "nats.podAnnotations", "server.podAnnotations"}
	chartLabels := []string{
		"app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/component", "grafana_dashboard",
		"kubernetes.io/metadata.name", "pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/" + word(r),
		"compass-runner.io/" + word(r),
	}
	set := func(path, key string) map[string]any {
		inner := map[string]any{key: word(r)}
		parts := strings.Split(path, ".")
		for i := len(parts) - 1; i >= 0; i-- {
			inner = map[string]any{parts[i]: inner}
		}
		return inner
	}
	type refusal struct{ path, key string }
	var refused []refusal
	for _, v := range labelValues {
		for _, k := range chartLabels {
			refused = append(refused, refusal{v, k})
		}
	}
	for _, v := range annotationValues {
		refused = append(refused, refusal{v, "compass-runner.io/" + word(r)}, refusal{v, "compass-runner.io/cluster-name"})
	}
	for _, tc := range refused {
		t.Run(tc.path+" "+tc.key, func(t *testing.T) {
			out, err := RenderValues(p, set(tc.path, tc.key))
			if !errors.Is(err, chart.ErrInvalidValues) || !strings.Contains(err.Error(), tc.path+": "+tc.key+" is") {
				t.Fatalf("err = %v, want chart.ErrInvalidValues naming %s and %s", err, tc.path, tc.key)
			}
			if out != nil {
				t.Fatal("output beside the error")
			}
		})
	}
	t.Run("commonLabels repeating a monitoring label", func(t *testing.T) {
		_, err := RenderValues(p, map[string]any{"commonLabels": map[string]any{"release": "x"}})
		if !errors.Is(err, chart.ErrInvalidValues) || !strings.Contains(err.Error(), "commonLabels: release is also a monitoring label") {
			t.Fatalf("err = %v", err)
		}
	})
	// Beside the chart's keys: the same domains, other names (on PostgreSQL,
	// where the callout has pods of its own).
	p = valuesTopologies()[1].p
	for _, v := range append(labelValues, annotationValues...) {
		key := "app.kubernetes.io/instance"
		if strings.Contains(v, "nnotations") {
			key = "example.com/" + word(r)
		}
		t.Run(v+" "+key+" renders", func(t *testing.T) {
			out, err := RenderValues(p, set(v, key))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(out, []byte(fmt.Sprintf("%q: ", key))) {
				t.Fatalf("%s not rendered", key)
			}
		})
	}
}

// Resources set to null set none, as Helm deletes a default a null
// replaces: the container has no requests and limits, rather than the
// chart's defaults or a broken block. ({} keeps the defaults: Helm merges a
// map into the default map.)
func TestNullResourcesRenderNone(t *testing.T) {
	p := valuesTopologies()[0].p
	vals := map[string]any{
		"runner": map[string]any{"resources": nil},
		"nats":   map[string]any{"resources": nil, "reloaderResources": nil},
		"server": map[string]any{"resources": nil},
	}
	got := byKey(renderValues(t, p, vals))
	ns := p.CalloutNamespace
	for key, containers := range map[string][]string{
		"DaemonSet " + p.Namespace + "/" + RunnerDaemonSet: {"runner"},
		"StatefulSet " + ns + "/nats":                      {"nats", "reloader"},
		"StatefulSet " + ns + "/" + ServerName:             {"server"},
	} {
		for _, c := range containers {
			checkEqual(t, key+" "+c+" resources", podContainer(t, podNamed(t, got, key).Spec, c).Resources, corev1.ResourceRequirements{})
		}
	}
	// The callout's stay: it was not emptied.
	if kept := podContainer(t, podNamed(t, got, "StatefulSet "+ns+"/"+ServerName).Spec, "callout").Resources; kept.Requests.Cpu().IsZero() {
		t.Fatal("the callout's resources were emptied too")
	}
}

// The resources values.yaml documents are the ones every rendering carries
// by default, and those are the numbers the chart always rendered (a
// default rendering without operator values is unchanged).
func TestDefaultResourcesAreValuesYAMLs(t *testing.T) {
	raw, err := chartFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	documented := func(path ...string) corev1.ResourceRequirements {
		v := any(defaults)
		for _, p := range path {
			v = v.(map[string]any)[p]
		}
		var rr corev1.ResourceRequirements
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, &rr); err != nil {
			t.Fatal(err)
		}
		return rr
	}
	res := func(cpu, mem, limit string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)},
		}
	}
	ns := "compass-system"
	for _, tc := range valuesTopologies() {
		got := byKey(renderValues(t, tc.p, nil))
		type row struct {
			key, container string
			values         []string
			always         corev1.ResourceRequirements
		}
		rows := []row{
			{"DaemonSet compass-runner/" + RunnerDaemonSet, "runner", []string{"runner", "resources"}, res("50m", "64Mi", "256Mi")},
			{"StatefulSet " + ns + "/" + ServerName, "callout", []string{"callout", "resources"}, res("100m", "64Mi", "256Mi")},
			{"StatefulSet " + ns + "/" + ServerName, "server", []string{"server", "resources"}, res("100m", "64Mi", "512Mi")},
			{"StatefulSet " + ns + "/nats", "nats", []string{"nats", "resources"}, res("100m", "128Mi", "512Mi")},
			{"StatefulSet " + ns + "/nats", "reloader", []string{"nats", "reloaderResources"}, res("5m", "8Mi", "32Mi")},
		}
		if tc.p.ServerDatabaseSecret != "" {
			rows = []row{
				rows[0],
				{"Deployment " + ns + "/compass-callout", "callout", []string{"callout", "resources"}, res("100m", "64Mi", "256Mi")},
				{"Deployment " + ns + "/" + ServerName, "server", []string{"server", "resources"}, res("100m", "64Mi", "512Mi")},
				{"Deployment " + ns + "/nats", "nats", []string{"nats", "resources"}, res("100m", "128Mi", "512Mi")},
				{"Deployment " + ns + "/nats", "reloader", []string{"nats", "reloaderResources"}, res("5m", "8Mi", "32Mi")},
			}
		}
		for _, row := range rows {
			c := podContainer(t, podNamed(t, got, row.key).Spec, row.container)
			checkEqual(t, tc.name+": "+row.key+" "+row.container+" resources", c.Resources, row.always)
			checkEqual(t, "values.yaml "+strings.Join(row.values, "."), documented(row.values...), row.always)
		}
	}
}

// chartFile reads a file of the embedded chart.
func chartFile(name string) ([]byte, error) {
	return fs.ReadFile(chart.FS(), name)
}

// The Runner's DaemonSet keeps DL-440's shape with every operator value set:
// maxSurge 0, no API token, the Runner ServiceAccount and the projected
// token; and the admission policy rendered with it still admits it from a
// deployer only, refuses an edit user changing its pod labels (they are its
// spec), and admits an edit user's metadata-only update adding a common
// label, as DL-440 says.
func TestRunnerDaemonSetWithOperatorValuesKeepsDL440(t *testing.T) {
	r := newRand(t)
	o := genOperatorValues(t, r)
	p := DefaultParams()
	objs := renderValues(t, p, o.vals)
	ds := runnerDaemonSet(t, objs, p.Namespace)
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 {
		t.Fatalf("rollingUpdate = %+v, want maxSurge 0", ru)
	}
	checkNoAPIToken(t, "DaemonSet "+ds.Name, &ds.Spec.Template.Spec)
	if ds.Spec.Template.Spec.ServiceAccountName != RunnerServiceAccount {
		t.Fatalf("serviceAccountName = %q", ds.Spec.Template.Spec.ServiceAccountName)
	}
	if tok := projectedToken(t, ds); tok.Audience != "compass-runner" || *tok.ExpirationSeconds != 600 {
		t.Fatalf("projected token %+v", tok)
	}
	v := newValidator(t, runnerPolicy(t, objs))
	if got := evaluate(t, v, create(dsGVR, ds, RunnerDaemonSet, kustomize)); got != admit {
		t.Fatalf("a deployer creating the rendered DaemonSet: %q", got)
	}
	if got := evaluate(t, v, create(dsGVR, ds, RunnerDaemonSet, editUser)); got != msgDeployer {
		t.Fatalf("an edit user creating the rendered DaemonSet: %q, want %q", got, msgDeployer)
	}
	update := func(change func(*appsv1.DaemonSet)) request {
		obj := ds.DeepCopy()
		change(obj)
		req := create(dsGVR, obj, RunnerDaemonSet, editUser)
		req.op, req.old = admission.Update, ds
		return req
	}
	if got := evaluate(t, v, update(func(d *appsv1.DaemonSet) { d.Spec.Template.Labels["team.example.com/x"] = word(r) })); got != msgDeployer {
		t.Fatalf("an edit user adding a pod label: %q, want %q", got, msgDeployer)
	}
	if got := evaluate(t, v, update(func(d *appsv1.DaemonSet) { d.Labels["team.example.com/x"] = word(r) })); got != admit {
		t.Fatalf("an edit user adding a label to the DaemonSet's metadata: %q, want admitted", got)
	}
}
