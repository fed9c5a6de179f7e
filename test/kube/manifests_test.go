package kube

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
)

// runnerManifests are the manifests an operator applies: package deploy's
// rendering with DL-440's defaults, for a cluster registered as "live".
func runnerManifests() ([]byte, error) {
	p := deploy.DefaultParams()
	p.ClusterName = "live"
	data, err := deploy.Render(p)
	if err != nil {
		return nil, fmt.Errorf("test/kube: render manifests: %w", err)
	}
	return data, nil
}

// runnerObjects are runnerManifests parsed.
func runnerObjects() ([]*unstructured.Unstructured, error) {
	data, err := runnerManifests()
	if err != nil {
		return nil, err
	}
	return splitManifests(data)
}

// splitManifests parses a multi-document YAML stream into objects.
func splitManifests(data []byte) ([]*unstructured.Unstructured, error) {
	docs, err := deploytest.Documents(data)
	if err != nil {
		return nil, fmt.Errorf("test/kube: manifests: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, doc := range docs {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("test/kube: manifests: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}

// policyKinds are the kinds that make up the admission policy.
func isPolicy(u *unstructured.Unstructured) bool {
	return u.GetKind() == "ValidatingAdmissionPolicy" || u.GetKind() == "ValidatingAdmissionPolicyBinding"
}

// applyManifests server-side applies the objects keep selects, as the
// deployers identity (Flux's kustomize-controller, bound to cluster-admin as
// Flux installs it).
func (s *apiServer) applyManifests(ctx context.Context, objs []*unstructured.Unstructured, keep func(*unstructured.Unstructured) bool) error {
	return s.applyManifestsDry(ctx, objs, keep, false)
}

// applyManifestsDry is applyManifests; with dryRun the API server validates,
// defaults and admits every object as for a real apply but stores none.
func (s *apiServer) applyManifestsDry(ctx context.Context, objs []*unstructured.Unstructured, keep func(*unstructured.Unstructured) bool, dryRun bool) error {
	cfg := s.asConfig(deployerUser, "system:serviceaccounts", "system:serviceaccounts:flux-system", "system:authenticated")
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("test/kube: %w", err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		return fmt.Errorf("test/kube: discovery: %w", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("test/kube: %w", err)
	}
	for _, u := range objs {
		if !keep(u) {
			continue
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("test/kube: apply %s %s: %w", gvk.Kind, u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := u.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		opts := metav1.ApplyOptions{FieldManager: "compass-runner-deploy", Force: true}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Apply(ctx, u.GetName(), u, opts); err != nil {
			return fmt.Errorf("test/kube: apply %s %s: %w", gvk.Kind, u.GetName(), err)
		}
	}
	return nil
}

// bindDeployer gives the deployers identity cluster-admin, as a Flux install does.
func (s *apiServer) bindDeployer(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "flux-kustomize-controller"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "flux-system", Name: "kustomize-controller"}},
	}
	if _, err := s.cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("test/kube: deployer binding: %w", err)
	}
	return nil
}

// ownerRef is a controller owner reference.
func ownerRef(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &yes, BlockOwnerDeletion: &yes}
}

// runnerPodFor builds the pod the DaemonSet controller creates for ds on node:
// the template, a generated name, the controller owner reference and the
// node affinity the controller sets (the scheduler then binds it).
func runnerPodFor(ds *appsv1.DaemonSet, node string) *corev1.Pod {
	tmpl := ds.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    ds.Name + "-",
			Namespace:       ds.Namespace,
			Labels:          tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef("apps/v1", "DaemonSet", ds.Name, ds.UID)},
		},
		Spec: tmpl.Spec,
	}
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	return pod
}

// createRunnerPod creates the Runner pod for node as the DaemonSet controller
// (impersonated) and binds it to node as the scheduler would.
func (s *apiServer) createRunnerPod(ctx context.Context, node string) (*corev1.Pod, error) {
	ds, err := s.cs.AppsV1().DaemonSets(runnerNS).Get(ctx, runnerDS, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("test/kube: get DaemonSet: %w", err)
	}
	pod, err := s.asServiceAccount(dsControllerUser).CoreV1().Pods(runnerNS).Create(ctx, runnerPodFor(ds, node), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("test/kube: create Runner pod as the DaemonSet controller: %w", err)
	}
	if err := bindPod(ctx, s.as("system:kube-scheduler", "system:authenticated"), pod, node); err != nil {
		return nil, err
	}
	return s.cs.CoreV1().Pods(runnerNS).Get(ctx, pod.Name, metav1.GetOptions{})
}

func bindPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, node string) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := cs.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("test/kube: bind pod to %s: %w", node, err)
	}
	return nil
}
