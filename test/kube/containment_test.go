package kube

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DL-456 on a real API server with both rendered policies enforcing: every
// route by which a user with `edit` in the Runner namespace could use a live
// Runner pod's token is refused, with the policy's own message, and what the
// controllers, the garbage collector and the kubelet write still goes through.
func TestLiveRunnerPodContainment(t *testing.T) {
	assets := requireBinaries(t)
	ctx := t.Context()
	e, err := newEnv(ctx, assets, "containment", true)
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
	image := pod.Spec.Containers[0].Image

	// alice has the built-in edit role in the Runner namespace; carol has it
	// too, and pods/ephemeralcontainers, which edit lacks (kubectl debug).
	// edit aggregates view (which no controller fills on this tier).
	for _, role := range []string{"view", "edit"} {
		if err := s.aggregateClusterRole(ctx, role); err != nil {
			t.Fatal(err)
		}
	}
	alice := s.certUser(t, "alice")
	carol := s.certUser(t, "carol")
	for _, u := range []string{"alice", "carol"} {
		if err := s.bindInNamespace(ctx, u+"-edit", "ClusterRole", "edit", u); err != nil {
			t.Fatal(err)
		}
	}
	debugRole := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "ephemeral-debugger", Namespace: runnerNS},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/ephemeralcontainers"},
			Verbs: []string{"get", "update", "patch"}}},
	}
	if _, err := s.cs.RbacV1().Roles(runnerNS).Create(ctx, debugRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.bindInNamespace(ctx, "carol-debug", "Role", "ephemeral-debugger", "carol"); err != nil {
		t.Fatal(err)
	}
	pods := alice.CoreV1().Pods(runnerNS)
	// Wait until RBAC has seen both users' bindings: an annotation, which
	// the policy admits, goes through for each.
	for i, cs := range []kubernetes.Interface{alice, carol} {
		if _, err := waitAuthorized(ctx, func(ctx context.Context) (string, error) {
			_, err := cs.CoreV1().Pods(runnerNS).Patch(ctx, pod.Name, types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"note-`+string(rune('a'+i))+`":"x"}}}`), metav1.PatchOptions{})
			return "", err
		}); err != nil {
			t.Fatalf("an edit user annotating the Runner pod: %v", err)
		}
	}

	t.Run("kubectl set image (a strategic-merge patch) is denied", func(t *testing.T) {
		patch := `{"spec":{"containers":[{"name":"runner","image":"attacker.example/runner:evil"}]}}`
		_, err := pods.Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		wantDeniedBy(t, err, containmentPolicyName, msgPodSpec)
		wantImage(t, s, pod.Name, image)
	})
	t.Run("a full update of the image is denied", func(t *testing.T) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.Containers[0].Image = "attacker.example/runner:evil"
		_, err = pods.Update(ctx, p, metav1.UpdateOptions{})
		wantDeniedBy(t, err, containmentPolicyName, msgPodSpec)
		wantImage(t, s, pod.Name, image)
	})
	t.Run("releasing the pod from the DaemonSet is denied", func(t *testing.T) {
		_, err := pods.Patch(ctx, pod.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"app.kubernetes.io/name":"mine"}}}`), metav1.PatchOptions{})
		wantDeniedBy(t, err, containmentPolicyName, msgPodOwners)
		_, err = pods.Patch(ctx, pod.Name, types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`), metav1.PatchOptions{})
		wantDeniedBy(t, err, containmentPolicyName, msgPodOwners)
	})
	for _, sub := range []string{"exec", "attach", "portforward"} {
		t.Run(sub+" is denied", func(t *testing.T) {
			req := alice.CoreV1().RESTClient().Post().Namespace(runnerNS).Resource("pods").Name(pod.Name).SubResource(sub)
			switch sub {
			case "exec":
				req = req.Param("command", "sh").Param("stdin", "true").Param("stdout", "true").Param("container", "runner")
			case "attach":
				req = req.Param("stdin", "true").Param("stdout", "true").Param("container", "runner")
			case "portforward":
				req = req.Param("ports", "8081")
			}
			wantDeniedBy(t, req.Do(ctx).Error(), containmentPolicyName, msgConnect)
		})
	}
	t.Run("an ephemeral container (kubectl debug) is denied", func(t *testing.T) {
		// As an attacker writes it: one the namespace's restricted Pod
		// Security admits, so only the policy stands in its way.
		debug := map[string]any{"spec": map[string]any{"ephemeralContainers": []any{map[string]any{
			"name": "debugger", "image": "busybox:1", "targetContainerName": "runner",
			"stdin": true, "tty": true,
			"securityContext": map[string]any{"allowPrivilegeEscalation": false, "runAsNonRoot": true,
				"capabilities": map[string]any{"drop": []any{"ALL"}}, "seccompProfile": map[string]any{"type": "RuntimeDefault"}},
			"volumeMounts": []any{map[string]any{"name": "compass-runner-token", "mountPath": "/t", "readOnly": true}},
		}}}}
		patch, err := json.Marshal(debug)
		if err != nil {
			t.Fatal(err)
		}
		// edit alone does not grant it (RBAC refuses alice before admission).
		_, err = pods.Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "ephemeralcontainers")
		if !isForbiddenByRBAC(err) {
			t.Fatalf("alice adding an ephemeral container: %v; want RBAC's refusal", err)
		}
		_, err = carol.CoreV1().Pods(runnerNS).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "ephemeralcontainers")
		wantDeniedBy(t, err, containmentPolicyName, msgEphemeral)
		p, err := s.cs.CoreV1().Pods(runnerNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.EphemeralContainers) != 0 {
			t.Fatalf("the pod has ephemeral containers %v", p.Spec.EphemeralContainers)
		}
	})
	t.Run("kubectl debug --copy-to (a copy with the Runner ServiceAccount) is denied", func(t *testing.T) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name + "-debug", Namespace: runnerNS, Labels: p.Labels}, Spec: p.Spec}
		cp.Spec.Containers[0].Image = "busybox:1"
		_, err = pods.Create(ctx, cp, metav1.CreateOptions{})
		wantDenied(t, err, msgPodOwner)
	})

	// What the controllers, the garbage collector and the kubelet write.
	t.Run("the controllers and the garbage collector may release the pod", func(t *testing.T) {
		// As they do it: a patch of the owner references (dry runs, so the
		// pod stays the DaemonSet's), each under its own RBAC.
		release := []byte(`{"metadata":{"ownerReferences":null}}`)
		dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
		for _, cs := range map[string]kubernetes.Interface{
			dsControllerUser: s.asServiceAccount(dsControllerUser),
			"system:serviceaccount:kube-system:generic-garbage-collector": s.asServiceAccount("system:serviceaccount:kube-system:generic-garbage-collector"),
			// The shared credential's bootstrap role does not cover pods on
			// this tier; system:masters stands in for the rights it has
			// where it is used (the policy, not RBAC, is under test).
			sharedCMUser: s.as(sharedCMUser, "system:masters", "system:authenticated"),
		} {
			if _, err := cs.CoreV1().Pods(runnerNS).Patch(ctx, pod.Name, types.MergePatchType, release, dry); err != nil {
				t.Fatalf("releasing the pod (dry run): %v", err)
			}
		}
	})
	t.Run("the kubelet still writes the pod's status", func(t *testing.T) {
		kubelet := s.asKubelet(runnerNode)
		err := poll(ctx, func(ctx context.Context) (bool, error) {
			p, err := kubelet.CoreV1().Pods(runnerNS).Get(ctx, pod.Name, metav1.GetOptions{})
			if isForbiddenByRBAC(err) {
				return false, nil // the Node authorizer has not seen the pod yet
			}
			if err != nil {
				return false, err
			}
			p.Status.Phase = corev1.PodRunning
			_, err = kubelet.CoreV1().Pods(runnerNS).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err == nil, err
		})
		if err != nil {
			t.Fatalf("the kubelet's status update: %v", err)
		}
	})
	t.Run("an edit user may still delete the pod (the DaemonSet replaces it)", func(t *testing.T) {
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete: %v", err)
		}
	})
}

// wantImage fails unless the stored pod runs image.
func wantImage(t *testing.T, s *apiServer, name, image string) {
	t.Helper()
	p, err := s.cs.CoreV1().Pods(runnerNS).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Spec.Containers[0].Image; got != image {
		t.Fatalf("the stored pod runs %q, want %q", got, image)
	}
}
