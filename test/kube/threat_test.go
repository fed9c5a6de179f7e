package kube

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// DL-440 W4 threat proof on a real API server, in the order DL-440 lists it.
// The cluster starts without the admission policy; subtests run in order
// because each changes what the next one sees.
func TestLiveThreatProof(t *testing.T) {
	assets := requireBinaries(t)
	ctx := t.Context()
	e, err := newEnv(ctx, assets, "threat", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.close(); err != nil {
			t.Error(err)
		}
	})
	s := e.srv
	pod, err := s.createRunnerPod(ctx, runnerNode)
	if err != nil {
		t.Fatal(err)
	}
	v := loadedVerifier(t, e.clusterFile)

	// alice has the built-in edit role in the Runner namespace; bob may
	// create, update and delete DaemonSets there.
	if err := s.aggregateClusterRole(ctx, "edit"); err != nil {
		t.Fatal(err)
	}
	alice := s.certUser(t, "alice")
	bob := s.certUser(t, "bob")
	if err := s.bindInNamespace(ctx, "alice-edit", "ClusterRole", "edit", "alice"); err != nil {
		t.Fatal(err)
	}
	dsRole := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "daemonset-editor", Namespace: runnerNS},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"},
			Verbs: []string{"get", "list", "create", "update", "patch", "delete"}}},
	}
	if _, err := s.cs.RbacV1().Roles(runnerNS).Create(ctx, dsRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.bindInNamespace(ctx, "bob-daemonsets", "Role", "daemonset-editor", "bob"); err != nil {
		t.Fatal(err)
	}

	t.Run("without the policy an edit user's token for the Runner pod enrolls", func(t *testing.T) {
		if err := s.probePolicy(ctx); err != nil {
			t.Fatalf("the policy is already enforcing: %v", err)
		}
		tok, err := waitAuthorized(ctx, func(ctx context.Context) (string, error) {
			return tokenFor(ctx, alice, runnerSA, pod, runnerAudience)
		})
		if err != nil {
			t.Fatalf("alice's token request: %v", err)
		}
		resp, err := newCompassStack(t, e.clusterFile).enroll(ctx, tok)
		if err != nil || resp.GetRunnerId() != runnerID {
			t.Fatalf("alice's token enrolls as %q, %v; want %q (the threat the policy closes)", resp.GetRunnerId(), err, runnerID)
		}
	})

	objs, err := runnerObjects()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.applyPolicy(ctx, objs); err != nil {
		t.Fatal(err)
	}

	t.Run("with the policy the same token request is denied", func(t *testing.T) {
		_, err := tokenFor(ctx, alice, runnerSA, pod, runnerAudience)
		// Both policies refuse alice; which message the API server shows
		// first is its choice. Each alone is shown below.
		if !isPolicyDenial(err, msgTokenKubelet) && !isDeniedBy(err, containmentPolicyName, msgNodesGroup) {
			t.Fatalf("error = %v; want a policy's denial of a non-kubelet token request", err)
		}
		// A kubelet's username outside the system:nodes group: only DL-456's.
		_, err = tokenFor(ctx, s.as("system:node:"+runnerNode, "system:masters", "system:authenticated"), runnerSA, pod, runnerAudience)
		wantDeniedBy(t, err, containmentPolicyName, msgNodesGroup)
		// The system:nodes group under another username: only DL-440's.
		_, err = tokenFor(ctx, s.as("mallory", "system:nodes", "system:masters", "system:authenticated"), runnerSA, pod, runnerAudience)
		wantDenied(t, err, msgTokenKubelet)
		// The kubelet still gets it: the Runner keeps working.
		tok, err := kubeletToken(ctx, s, runnerNode, pod)
		if err != nil {
			t.Fatal(err)
		}
		mustVerify(t, v, tok, "kubelet token with the policy")
	})

	dsAPI := bob.AppsV1().DaemonSets(runnerNS)
	t.Run("DaemonSet evil naming the Runner ServiceAccount is denied", func(t *testing.T) {
		evil := runnerDaemonSet(t, s)
		evil.ObjectMeta = metav1.ObjectMeta{Name: "evil", Namespace: runnerNS}
		_, err := dsAPI.Create(ctx, evil, metav1.CreateOptions{})
		wantDenied(t, err, msgOnlyDS)
	})
	t.Run("changing the compass-runner DaemonSet's spec is denied", func(t *testing.T) {
		ds := runnerDaemonSet(t, s)
		ds.Spec.Template.Spec.Containers[0].Image = "attacker.example/runner:evil"
		_, err := dsAPI.Update(ctx, ds, metav1.UpdateOptions{})
		wantDenied(t, err, msgDeployer)
	})
	t.Run("a metadata-only update of the compass-runner DaemonSet is admitted", func(t *testing.T) {
		ds := runnerDaemonSet(t, s)
		if ds.Labels == nil {
			ds.Labels = map[string]string{}
		}
		ds.Labels["team"] = "platform"
		got, err := dsAPI.Update(ctx, ds, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("metadata-only update: %v", err)
		}
		if got.Labels["team"] != "platform" {
			t.Fatal("label not stored")
		}
	})
	t.Run("deleting and recreating the compass-runner DaemonSet is denied", func(t *testing.T) {
		ds := runnerDaemonSet(t, s)
		if err := dsAPI.Delete(ctx, runnerDS, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete (not covered by the policy; RBAC allows it): %v", err)
		}
		ds.ObjectMeta = metav1.ObjectMeta{Name: runnerDS, Namespace: runnerNS, Labels: ds.Labels, Annotations: ds.Annotations}
		_, err := dsAPI.Create(ctx, ds, metav1.CreateOptions{})
		wantDenied(t, err, msgDeployer)
		// The deployer puts it back.
		if err := s.applyManifests(ctx, objs, func(u *unstructured.Unstructured) bool { return u.GetKind() == "DaemonSet" }); err != nil {
			t.Fatalf("deployer re-apply: %v", err)
		}
	})

	t.Run("dry-run Runner pods per controllers username", func(t *testing.T) {
		ds := runnerDaemonSet(t, s)
		owners := []struct {
			name  string
			owner metav1.OwnerReference
			deny  bool
		}{
			{"owner DaemonSet compass-runner", ownerRef("apps/v1", "DaemonSet", runnerDS, ds.UID), false},
			{"owner DaemonSet evil", ownerRef("apps/v1", "DaemonSet", "evil", types.UID("6d7a4a57-0000-4000-8000-000000000001")), true},
			{"owner ReplicaSet", ownerRef("apps/v1", "ReplicaSet", runnerDS, types.UID("6d7a4a57-0000-4000-8000-000000000002")), true},
		}
		for _, user := range []string{dsControllerUser, sharedCMUser} {
			for _, o := range owners {
				t.Run(user+"/"+o.name, func(t *testing.T) {
					p := runnerPodFor(ds, runnerNode)
					p.OwnerReferences = []metav1.OwnerReference{o.owner}
					_, err := s.as(user, "system:masters").CoreV1().Pods(runnerNS).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
					if o.deny {
						wantDenied(t, err, msgPodOwner)
					} else if err != nil {
						t.Fatalf("dry-run create: %v", err)
					}
				})
			}
		}
	})

	t.Run("other workloads naming the Runner ServiceAccount are denied", func(t *testing.T) {
		tmpl := runnerDaemonSet(t, s).Spec.Template
		sel := &metav1.LabelSelector{MatchLabels: tmpl.Labels}
		one := int32(1)
		never := tmpl.DeepCopy()
		never.Spec.RestartPolicy = corev1.RestartPolicyNever
		meta := metav1.ObjectMeta{Name: "uses-runner-sa", Namespace: runnerNS}
		admin := s.cs
		create := map[string]func() error{
			"Deployment": func() error {
				_, err := admin.AppsV1().Deployments(runnerNS).Create(ctx, &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: sel, Template: tmpl}}, metav1.CreateOptions{})
				return err
			},
			"StatefulSet": func() error {
				_, err := admin.AppsV1().StatefulSets(runnerNS).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta, Spec: appsv1.StatefulSetSpec{Replicas: &one, Selector: sel, Template: tmpl}}, metav1.CreateOptions{})
				return err
			},
			"Job": func() error {
				_, err := admin.BatchV1().Jobs(runnerNS).Create(ctx, &batchv1.Job{ObjectMeta: meta, Spec: batchv1.JobSpec{Template: *never}}, metav1.CreateOptions{})
				return err
			},
			"CronJob": func() error {
				_, err := admin.BatchV1().CronJobs(runnerNS).Create(ctx, &batchv1.CronJob{ObjectMeta: meta, Spec: batchv1.CronJobSpec{Schedule: "*/5 * * * *",
					JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: *never}}}}, metav1.CreateOptions{})
				return err
			},
			"ReplicaSet": func() error {
				_, err := admin.AppsV1().ReplicaSets(runnerNS).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: meta, Spec: appsv1.ReplicaSetSpec{Replicas: &one, Selector: sel, Template: tmpl}}, metav1.CreateOptions{})
				return err
			},
			"ReplicationController": func() error {
				_, err := admin.CoreV1().ReplicationControllers(runnerNS).Create(ctx, &corev1.ReplicationController{ObjectMeta: meta, Spec: corev1.ReplicationControllerSpec{Replicas: &one, Selector: tmpl.Labels, Template: &tmpl}}, metav1.CreateOptions{})
				return err
			},
		}
		for _, kind := range []string{"Deployment", "StatefulSet", "Job", "CronJob", "ReplicaSet", "ReplicationController"} {
			t.Run(kind, func(t *testing.T) {
				wantDenied(t, create[kind](), msgOnlyDS)
			})
		}
	})
}

// wantDenied fails unless err is the policy's denial with message msg.
func wantDenied(t *testing.T, err error, msg string) {
	t.Helper()
	wantDeniedBy(t, err, policyName, msg)
}

// wantDeniedBy fails unless err is policy's denial with message msg.
func wantDeniedBy(t *testing.T, err error, policy, msg string) {
	t.Helper()
	if !isDeniedBy(err, policy, msg) {
		t.Fatalf("error = %v; want the policy %s denying with %q", err, policy, msg)
	}
}

// runnerDaemonSet is the current compass-runner DaemonSet.
func runnerDaemonSet(t *testing.T, s *apiServer) *appsv1.DaemonSet {
	t.Helper()
	ds, err := s.cs.AppsV1().DaemonSets(runnerNS).Get(t.Context(), runnerDS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// certUser provisions a user authenticated by a client certificate.
func (s *apiServer) certUser(t *testing.T, name string) kubernetes.Interface {
	t.Helper()
	u, err := s.env.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(u.Config())
}

// bindInNamespace binds a role to a user in the Runner namespace.
func (s *apiServer) bindInNamespace(ctx context.Context, name, kind, role, user string) error {
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: runnerNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	_, err := s.cs.RbacV1().RoleBindings(runnerNS).Create(ctx, rb, metav1.CreateOptions{})
	return err
}

// aggregateClusterRole fills an aggregated ClusterRole's rules from the roles
// its aggregationRule selects, as kube-controller-manager's
// clusterrole-aggregation controller does (this tier runs no controller
// manager, so the built-in edit role is otherwise empty).
func (s *apiServer) aggregateClusterRole(ctx context.Context, name string) error {
	role, err := s.cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if role.AggregationRule == nil {
		return errors.New("test/kube: ClusterRole " + name + " is not aggregated")
	}
	var rules []rbacv1.PolicyRule
	for _, sel := range role.AggregationRule.ClusterRoleSelectors {
		ls, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil {
			return err
		}
		list, err := s.cs.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: ls.String()})
		if err != nil {
			return err
		}
		for _, r := range list.Items {
			if r.Name != name {
				rules = append(rules, r.Rules...)
			}
		}
	}
	role.Rules = rules
	_, err = s.cs.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{})
	return err
}

// waitAuthorized retries f while RBAC has not yet seen new bindings
// (Forbidden from the authorizer, not from the policy).
func waitAuthorized(ctx context.Context, f func(context.Context) (string, error)) (string, error) {
	var out string
	var last error
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		out, last = f(ctx)
		if isForbiddenByRBAC(last) {
			return false, nil
		}
		return last == nil, last
	})
	if err != nil && last != nil {
		return "", last
	}
	return out, err
}

// isForbiddenByRBAC is a 403 that is not the policy's denial.
func isForbiddenByRBAC(err error) bool {
	return apierrors.IsForbidden(err) && !isAnyPolicyDenial(err)
}
