package deploy

import (
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
)

// The containment policy's messages (DL-456).
const (
	msgNodesGroup = "only kubelets (group system:nodes) may request a compass-runner token"
	msgPodSpec    = "a compass-runner pod's spec cannot be changed: a deployer changes the compass-runner DaemonSet, whose controller replaces the pods"
	msgPodOwners  = "only the controllers may change a compass-runner pod's labels or owners: a pod released from the DaemonSet would keep the node's identity beside its replacement"
	msgEphemeral  = "ephemeral containers cannot be added to a compass-runner pod: they could mount its token"
	msgConnect    = "exec, attach and port-forward are refused on compass-runner pods: a session in the pod could use the node's Runner token"
	gcUser        = "system:serviceaccount:kube-system:generic-garbage-collector"
	runnerPodName = "compass-runner-x7k2p"
)

func containmentPolicy(t *testing.T, objs []runtime.Object) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	return only[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "", ContainmentPolicyName)
}

// runnerPod is a Runner pod as the DaemonSet controller creates it: the
// Runner ServiceAccount, the DaemonSet as controller, the template's labels.
func runnerPod(sa string) *corev1.Pod {
	p := pod(sa, owner("DaemonSet", runnerDSName, true))
	p.Name = runnerPodName
	p.Labels = map[string]string{"app.kubernetes.io/name": "compass-runner"}
	return p
}

// podUpdate is an UPDATE of the pod resource (or of sub, a subresource of
// it) from old to what change makes of a copy.
func podUpdate(old *corev1.Pod, sub, username string, change func(*corev1.Pod)) request {
	obj := old.DeepCopy()
	change(obj)
	return request{
		gvk: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, gvr: podsGVR, sub: sub, name: old.Name,
		op: admission.Update, obj: obj, old: old, user: username,
	}
}

// connect is a CONNECT to a pod's exec, attach or portforward subresource,
// with the options object the API server admits.
func connect(sub, podName, username string, groups ...string) request {
	var obj runtime.Object
	var kind string
	switch sub {
	case "exec":
		obj, kind = &corev1.PodExecOptions{Command: []string{"sh"}, Stdin: true, TTY: true}, "PodExecOptions"
	case "attach":
		obj, kind = &corev1.PodAttachOptions{Stdin: true}, "PodAttachOptions"
	case "portforward":
		obj, kind = &corev1.PodPortForwardOptions{Ports: []int32{8081}}, "PodPortForwardOptions"
	}
	return request{
		gvk: schema.GroupVersionKind{Version: "v1", Kind: kind}, gvr: podsGVR, sub: sub, name: podName,
		op: admission.Connect, obj: obj, user: username, groups: groups,
	}
}

func TestContainmentPolicy_CompilesAndTypeChecks(t *testing.T) {
	for name, p := range map[string]Params{"default": DefaultParams(), "custom": customParams(t)} {
		t.Run(name, func(t *testing.T) {
			pol := containmentPolicy(t, rendered(t, p))
			if problems := compileAdmission(pol); len(problems) != 0 {
				t.Fatalf("the policy does not compile as the API server compiles it:\n%s", strings.Join(problems, "\n"))
			}
			for _, w := range newTypeChecker().Check(pol) {
				t.Errorf("type check: %s: %s", w.FieldRef, strings.TrimSpace(w.Warning))
			}
		})
	}
}

func TestContainmentPolicy_Evaluation(t *testing.T) {
	v := newValidator(t, containmentPolicy(t, rendered(t, DefaultParams())))
	rp := runnerPod(runnerSA)
	other := runnerPod(otherSA)
	other.Name = "web-1"
	noSA := runnerPod("")
	setImage := func(p *corev1.Pod) { p.Spec.Containers[0].Image = "attacker.example/runner:evil" }
	addDebug := func(p *corev1.Pod) {
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox:1"},
			TargetContainerName:      "c",
		})
	}
	kubelet := func(username string, groups ...string) request {
		r := tokenRequest(runnerSA, username)
		r.groups = groups
		return r
	}

	tests := []struct {
		name string
		req  request
		want string
	}{
		// Tokens for the Runner ServiceAccount: a kubelet's username and group.
		{"kubelet requests the Runner token", kubelet(node, "system:nodes", "system:authenticated"), admit},
		{"a kubelet's username without the system:nodes group", kubelet(node, "system:authenticated"), msgNodesGroup},
		{"a kubelet's username with no groups at all", kubelet(node), msgNodesGroup},
		{"the system:nodes group under another username", kubelet(editUser, "system:nodes"), admit}, // DL-440's policy refuses it
		{"edit user requests another ServiceAccount's token", tokenRequest(otherSA, editUser), admit},

		// A Runner pod's spec never changes in place, whoever asks.
		{"edit user sets a Runner pod's image", podUpdate(rp, "", editUser, setImage), msgPodSpec},
		{"daemon-set-controller sets a Runner pod's image", podUpdate(rp, "", dsController, setImage), msgPodSpec},
		{"deployer sets a Runner pod's image", podUpdate(rp, "", kustomize, setImage), msgPodSpec},
		{"edit user sets activeDeadlineSeconds", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptrTo(int64(1)) }), msgPodSpec},
		{"edit user adds a toleration", podUpdate(rp, "", editUser, func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "k", Operator: corev1.TolerationOpExists})
		}), msgPodSpec},
		{"edit user sets the image of another ServiceAccount's pod", podUpdate(other, "", editUser, setImage), admit},
		{"edit user sets the image of a pod with no ServiceAccount", podUpdate(noSA, "", editUser, setImage), admit},

		// Labels and owners: the controllers' and the garbage collector's.
		{"edit user annotates a Runner pod", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.Annotations = map[string]string{"note": "x"} }), admit},
		{"edit user relabels a Runner pod", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.Labels["app.kubernetes.io/name"] = "x" }), msgPodOwners},
		{"edit user adds a label", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.Labels["team"] = "x" }), msgPodOwners},
		{"edit user removes every label", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.Labels = nil }), msgPodOwners},
		{"edit user removes the DaemonSet owner", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.OwnerReferences = nil }), msgPodOwners},
		{"edit user makes the owner not the controller", podUpdate(rp, "", editUser, func(p *corev1.Pod) { p.OwnerReferences[0].Controller = ptrTo(false) }), msgPodOwners},
		{"daemon-set-controller releases a Runner pod", podUpdate(rp, "", dsController, func(p *corev1.Pod) { p.OwnerReferences = nil }), admit},
		{"shared kube-controller-manager relabels a Runner pod", podUpdate(rp, "", kcm, func(p *corev1.Pod) { p.Labels["team"] = "x" }), admit},
		{"garbage collector orphans a Runner pod", podUpdate(rp, "", gcUser, func(p *corev1.Pod) { p.OwnerReferences = nil }), admit},
		{"edit user relabels another ServiceAccount's pod", podUpdate(other, "", editUser, func(p *corev1.Pod) { p.Labels = nil }), admit},

		// Ephemeral containers (kubectl debug), whoever asks.
		{"edit user adds an ephemeral container to a Runner pod", podUpdate(rp, "ephemeralcontainers", editUser, addDebug), msgEphemeral},
		{"kube-controller-manager adds an ephemeral container to a Runner pod", podUpdate(rp, "ephemeralcontainers", kcm, addDebug), msgEphemeral},
		{"edit user adds an ephemeral container to another pod", podUpdate(other, "ephemeralcontainers", editUser, addDebug), admit},

		// exec, attach, port-forward on the DaemonSet's pods, whoever asks.
		{"edit user execs into a Runner pod", connect("exec", runnerPodName, editUser), msgConnect},
		{"edit user attaches to a Runner pod", connect("attach", runnerPodName, editUser), msgConnect},
		{"edit user port-forwards to a Runner pod", connect("portforward", runnerPodName, editUser), msgConnect},
		{"a cluster admin execs into a Runner pod", connect("exec", runnerPodName, "admin", "system:masters"), msgConnect},
		{"edit user execs into another pod", connect("exec", "web-1", editUser), admit},
		{"edit user execs into a pod named compass-runner", connect("exec", "compass-runner", editUser), admit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := evaluate(t, v, tt.req); got != tt.want {
				t.Fatalf("decision = %q, want %q (empty: admitted)", got, tt.want)
			}
		})
	}
}

// TestContainmentPolicy_EvaluationFollowsControllers: the rendered
// controllers are the ones that may change a Runner pod's labels and owners.
func TestContainmentPolicy_EvaluationFollowsControllers(t *testing.T) {
	p := DefaultParams()
	p.Controllers = []string{kcm}
	v := newValidator(t, containmentPolicy(t, rendered(t, p)))
	release := func(p *corev1.Pod) { p.OwnerReferences = nil }
	if got := evaluate(t, v, podUpdate(runnerPod(runnerSA), "", dsController, release)); got != msgPodOwners {
		t.Fatalf("narrowed controllers: daemon-set-controller decision = %q, want %q", got, msgPodOwners)
	}
	for _, u := range []string{kcm, gcUser} {
		if got := evaluate(t, v, podUpdate(runnerPod(runnerSA), "", u, release)); got != admit {
			t.Fatalf("narrowed controllers: %s decision = %q, want admit", u, got)
		}
	}
}

// TestContainmentPolicy_Shape: matched in the Runner namespace only, on
// exactly the routes DL-456 closes, failing closed, bound with Deny.
func TestContainmentPolicy_Shape(t *testing.T) {
	for name, p := range map[string]Params{"default": DefaultParams(), "custom": customParams(t)} {
		t.Run(name, func(t *testing.T) {
			objs := rendered(t, p)
			pol := containmentPolicy(t, objs)
			if pol.Spec.FailurePolicy == nil || *pol.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Fatalf("failurePolicy = %v, want Fail", pol.Spec.FailurePolicy)
			}
			if pol.Spec.ParamKind != nil || len(pol.Spec.MatchConditions) != 0 {
				t.Fatal("the policy has a paramKind or matchConditions")
			}
			rule := func(op admissionregistrationv1.OperationType, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
				return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{op},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources},
				}}
			}
			want := &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": p.Namespace}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
					rule(admissionregistrationv1.Create, "serviceaccounts/token"),
					rule(admissionregistrationv1.Update, "pods", "pods/ephemeralcontainers"),
					rule(admissionregistrationv1.Connect, "pods/exec", "pods/attach", "pods/portforward"),
				},
			}
			if !reflect.DeepEqual(pol.Spec.MatchConstraints, want) {
				t.Fatalf("matchConstraints = %+v\nwant %+v", pol.Spec.MatchConstraints, want)
			}
			b := only[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "", ContainmentPolicyName)
			if b.Spec.PolicyName != ContainmentPolicyName || b.Spec.ParamRef != nil || b.Spec.MatchResources != nil ||
				!reflect.DeepEqual(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
				t.Fatalf("binding = %+v, want policy %s, Deny, nothing narrowed", b.Spec, ContainmentPolicyName)
			}
		})
	}
}
