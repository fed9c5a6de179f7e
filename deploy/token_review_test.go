package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// renderedValues is rendered with extra chart values laid over p's.
func renderedValues(t *testing.T, p Params, extra map[string]any) []runtime.Object {
	t.Helper()
	out, err := RenderValues(p, extra)
	if err != nil {
		t.Fatalf("RenderValues: %v", err)
	}
	objs, err := decodeStrict(out)
	if err != nil {
		t.Fatalf("strict decode: %v", err)
	}
	return objs
}

// tokenReviewOn is the values of tokenReview.enabled, with the API
// server's addresses for the NetworkPolicies.
func tokenReviewOn(cidrs ...string) map[string]any {
	return map[string]any{
		"tokenReview":     map[string]any{"enabled": true},
		"networkPolicies": map[string]any{"apiServerCIDRs": cidrs},
	}
}

// With tokenReview.enabled the doors, and only they, may create
// TokenReviews and nothing else: one ClusterRole with that one rule, bound
// to the callout's and the Server's ServiceAccounts, nothing rendered in the
// Runner's namespace (DL-440: no RoleBinding there). Every container of a
// door (the Server, the callout in its pod or its own) mounts the projected
// API token and the cluster's CA where the cluster file's tokenReview names
// them, and may reach the API server's addresses on 443 and 6443, nothing
// else new. Off (the default), none of it is rendered.
func TestRender_TokenReview(t *testing.T) {
	for _, l := range []struct {
		name   string
		params func() Params
		// the workloads running a door's container, and its containers
		workloads map[string][]string
	}{
		{"SQLite", sqliteServerParams, map[string][]string{ServerName: {"server", "callout"}}},
		{"PostgreSQL", postgresServerParams, map[string][]string{ServerName: {"server"}, "compass-callout": {"callout"}}},
		{"no Server", DefaultParams, map[string][]string{"compass-callout": {"callout"}}},
	} {
		t.Run(l.name, func(t *testing.T) {
			p := l.params()
			objs := renderedValues(t, p, tokenReviewOn("10.96.0.1/32", "192.0.2.10/32"))
			role := only[*rbacv1.ClusterRole](t, objs, "", "compass-token-reviewer")
			want := []rbacv1.PolicyRule{{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}}}
			if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, want[0].APIGroups) ||
				!slices.Equal(role.Rules[0].Resources, want[0].Resources) || !slices.Equal(role.Rules[0].Verbs, want[0].Verbs) ||
				len(role.Rules[0].ResourceNames) != 0 || len(role.Rules[0].NonResourceURLs) != 0 {
				t.Fatalf("ClusterRole rules = %+v, want %+v", role.Rules, want)
			}
			binding := only[*rbacv1.ClusterRoleBinding](t, objs, "", "compass-token-reviewer")
			var subjects []string
			for _, s := range binding.Subjects {
				if s.Kind != "ServiceAccount" || s.Namespace != p.CalloutNamespace {
					t.Fatalf("ClusterRoleBinding subject %+v: want a ServiceAccount of %s", s, p.CalloutNamespace)
				}
				subjects = append(subjects, s.Name)
			}
			slices.Sort(subjects)
			wantSubjects := []string{"compass-callout"}
			if p.ServerImage != "" {
				wantSubjects = append(wantSubjects, ServerName)
			}
			if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name || !slices.Equal(subjects, wantSubjects) {
				t.Fatalf("ClusterRoleBinding = %+v to %v, want the ClusterRole to %v", binding.RoleRef, subjects, wantSubjects)
			}
			for _, o := range objs {
				if m, ok := o.(interface{ GetNamespace() string }); ok && m.GetNamespace() == p.Namespace {
					switch o.(type) {
					case *rbacv1.RoleBinding, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
						t.Fatalf("an RBAC object in the Runner's namespace: %T", o)
					}
				}
			}
			for name, containers := range l.workloads {
				spec := podSpecOf(t, objs, p.CalloutNamespace, name)
				vol := volumeNamed(spec, "kube-api")
				if vol == nil || vol.Projected == nil || len(vol.Projected.Sources) != 2 ||
					vol.Projected.Sources[0].ServiceAccountToken == nil || vol.Projected.Sources[0].ServiceAccountToken.Path != "token" ||
					vol.Projected.Sources[0].ServiceAccountToken.Audience != "" ||
					vol.Projected.Sources[1].ConfigMap == nil || vol.Projected.Sources[1].ConfigMap.Name != "kube-root-ca.crt" {
					t.Fatalf("%s: volume kube-api = %+v, want the projected API token and kube-root-ca.crt", name, vol)
				}
				for _, c := range spec.Containers {
					mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
						return m.Name == "kube-api" && m.MountPath == "/var/run/secrets/compass/kube" && m.ReadOnly
					})
					if mounted != slices.Contains(containers, c.Name) {
						t.Fatalf("%s: container %s mounts the API token: %v, want %v", name, c.Name, mounted, !mounted)
					}
				}
			}
			checkFlows(t, objs, p.CalloutNamespace, []flow{
				{"the API server on 443", "compass-callout", false, external("10.96.0.1"), 443, tcp, true},
				{"the API server on 6443", "compass-callout", false, external("192.0.2.10"), 6443, tcp, true},
				{"another address on 6443", "compass-callout", false, external("203.0.113.7"), 6443, tcp, false},
			})

			for _, o := range renderedValues(t, p, nil) {
				switch v := o.(type) {
				case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
					t.Fatalf("tokenReview off, yet %T rendered", v)
				}
			}
		})
	}
}

// podSpecOf is the pod template of the Deployment or StatefulSet name in ns.
func podSpecOf(t *testing.T, objs []runtime.Object, ns, name string) corev1.PodSpec {
	t.Helper()
	for _, o := range objs {
		switch v := o.(type) {
		case *appsv1.Deployment:
			if v.Namespace == ns && v.Name == name {
				return v.Spec.Template.Spec
			}
		case *appsv1.StatefulSet:
			if v.Namespace == ns && v.Name == name {
				return v.Spec.Template.Spec
			}
		}
	}
	t.Fatalf("no Deployment or StatefulSet %s/%s", ns, name)
	return corev1.PodSpec{}
}

func volumeNamed(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// tokenReview.watchPods renders ClusterRole compass-runner-pod-watcher,
// read-only on pods, and binds it nowhere: the operator binds it in the
// Runner's namespace (DL-440: no RoleBinding rendered there). Without
// tokenReview.enabled it is refused.
func TestRender_TokenReviewWatchPods(t *testing.T) {
	p := sqliteServerParams()
	objs := renderedValues(t, p, map[string]any{"tokenReview": map[string]any{"enabled": true, "watchPods": true}})
	role := only[*rbacv1.ClusterRole](t, objs, "", "compass-runner-pod-watcher")
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, []string{""}) || !slices.Equal(role.Rules[0].Resources, []string{"pods"}) ||
		!slices.Equal(role.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Fatalf("ClusterRole compass-runner-pod-watcher rules = %+v, want get, list, watch on pods alone", role.Rules)
	}
	for _, o := range objs {
		switch b := o.(type) {
		case *rbacv1.ClusterRoleBinding:
			if b.RoleRef.Name == role.Name {
				t.Fatalf("ClusterRoleBinding %s binds the pod watcher cluster-wide", b.Name)
			}
		case *rbacv1.RoleBinding:
			t.Fatalf("RoleBinding %s/%s rendered", b.Namespace, b.Name)
		}
	}
	if _, err := RenderValues(p, map[string]any{"tokenReview": map[string]any{"watchPods": true}}); err == nil ||
		!strings.Contains(err.Error(), "tokenReview.watchPods: true without tokenReview.enabled") {
		t.Fatalf("watchPods without enabled: %v, want refused", err)
	}
	for _, o := range renderedValues(t, p, tokenReviewOn()) {
		if r, ok := o.(*rbacv1.ClusterRole); ok && r.Name == role.Name {
			t.Fatal("the pod watcher rendered without watchPods")
		}
	}
}
