package deploy

import (
	"context"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

var stringSliceType = reflect.TypeOf([]string{})

// newValidator builds the Validator exactly as the validating admission
// plugin's compilePolicy does (same environment, same compiler, same options).
func newValidator(t *testing.T, pol *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	t.Helper()
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	opts := plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: true}
	msgOpts := plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: false}
	vars := make([]plugincel.NamedExpressionAccessor, len(pol.Spec.Variables))
	for i, v := range pol.Spec.Variables {
		vars[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(vars, opts, environment.StoredExpressions)
	validations := make([]plugincel.ExpressionAccessor, len(pol.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(pol.Spec.Validations))
	for i, v := range pol.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	return validating.NewValidator(
		compiler.CompileCondition(validations, opts, environment.StoredExpressions),
		nil,
		compiler.CompileCondition(nil, opts, environment.StoredExpressions),
		compiler.CompileCondition(messages, msgOpts, environment.StoredExpressions),
		pol.Spec.FailurePolicy,
		nil,
	)
}

const (
	dsController  = "system:serviceaccount:kube-system:daemon-set-controller"
	kcm           = "system:kube-controller-manager"
	kustomize     = "system:serviceaccount:flux-system:kustomize-controller"
	editUser      = "alice"
	node          = "system:node:ip-10-0-1-5.ec2.internal"
	msgToken      = "only kubelets may request a compass-runner token"
	msgPod        = "compass-runner pods must come from the compass-runner DaemonSet"
	msgSA         = "only the compass-runner DaemonSet may use the compass-runner ServiceAccount"
	msgDeployer   = "only a deployer may create or change the compass-runner DaemonSet"
	runnerSA      = "compass-runner"
	otherSA       = "default"
	admit         = ""
	runnerNS      = "compass-runner"
	dsAPIVersion  = "apps/v1"
	runnerDSName  = "compass-runner"
	evilDSName    = "evil"
	replicaSetRef = "ReplicaSet"
)

func podSpec(sa string) corev1.PodSpec {
	return corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}
}

func podTemplate(sa string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: podSpec(sa)}
}

func owner(kind, name string, controller bool) metav1.OwnerReference {
	apiVersion := dsAPIVersion
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: "u", Controller: &controller}
}

func pod(sa string, owners ...metav1.OwnerReference) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: runnerNS, OwnerReferences: owners}, Spec: podSpec(sa)}
}

func daemonSet(name, sa string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: runnerNS}, Spec: appsv1.DaemonSetSpec{Template: podTemplate(sa)}}
}

// request is one admission request the policy is evaluated on.
type request struct {
	gvk      schema.GroupVersionKind
	gvr      schema.GroupVersionResource
	sub      string
	name     string
	op       admission.Operation
	obj, old runtime.Object
	user     string
	groups   []string
}

func create(gvr schema.GroupVersionResource, obj runtime.Object, name, username string) request {
	return request{gvk: matchedKinds[gvr], gvr: gvr, name: name, op: admission.Create, obj: obj, user: username}
}

var (
	podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	dsGVR   = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
)

func tokenRequest(sa, username string) request {
	return request{
		gvk:  schema.GroupVersionKind{Group: "authentication.k8s.io", Version: "v1", Kind: "TokenRequest"},
		gvr:  schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"},
		sub:  "token",
		name: sa,
		op:   admission.Create,
		obj: &authenticationv1.TokenRequest{
			ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: runnerNS},
			Spec:       authenticationv1.TokenRequestSpec{Audiences: []string{"compass-runner"}},
		},
		user: username,
	}
}

// evaluate runs the validator on r and returns "" when admitted or the
// message of the one denying validation. An evaluation error fails the test:
// with failurePolicy Fail it would deny, but for the wrong reason.
func evaluate(t *testing.T, v validating.Validator, r request) string {
	t.Helper()
	attrs := admission.NewAttributesRecord(r.obj, r.old, r.gvk, runnerNS, r.name, r.gvr, r.sub, r.op, nil, false, &user.DefaultInfo{Name: r.user, Groups: r.groups})
	va := &admission.VersionedAttributes{
		Attributes:         attrs,
		VersionedObject:    admission.NewLazyObject(r.obj),
		VersionedOldObject: admission.NewLazyObject(r.old),
		VersionedKind:      r.gvk,
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: runnerNS, Labels: map[string]string{"kubernetes.io/metadata.name": runnerNS}}}
	res := v.Validate(context.Background(), r.gvr, va, nil, ns, celconfig.RuntimeCELCostBudget, nil)
	var denied []string
	for _, d := range res.Decisions {
		switch {
		case d.Evaluation == validating.EvalError:
			t.Fatalf("evaluation error: %s", d.Message)
		case d.Action == validating.ActionDeny:
			denied = append(denied, d.Message)
		}
	}
	if len(denied) > 1 {
		t.Fatalf("denied by more than one validation: %q", denied)
	}
	if len(denied) == 1 {
		return denied[0]
	}
	return admit
}

func TestPolicyCEL_Evaluation(t *testing.T) {
	v := newValidator(t, renderedPolicy(t))
	runnerOwner := owner("DaemonSet", runnerDSName, true)

	dsUpdate := func(username string, changeSpec bool) request {
		old := daemonSet(runnerDSName, runnerSA)
		obj := old.DeepCopy()
		obj.Labels = map[string]string{"team": "x"} // metadata-only
		if changeSpec {
			obj.Spec.Template.Spec.Containers[0].Image = "evil:1"
		}
		r := create(dsGVR, obj, runnerDSName, username)
		r.op, r.old = admission.Update, old
		return r
	}

	tests := []struct {
		name string
		req  request
		want string
	}{
		// Validation 1: tokens for the ServiceAccount go only to kubelets.
		{"kubelet requests the Runner token", tokenRequest(runnerSA, node), admit},
		{"edit user requests the Runner token", tokenRequest(runnerSA, editUser), msgToken},
		{"controller requests the Runner token", tokenRequest(runnerSA, dsController), msgToken},
		{"edit user requests another token", tokenRequest(otherSA, editUser), admit},

		// Validation 2: Runner pods come from the DaemonSet, created by a controller.
		{"daemon-set-controller creates a Runner pod", create(podsGVR, pod(runnerSA, runnerOwner), "p", dsController), admit},
		{"shared kube-controller-manager creates a Runner pod", create(podsGVR, pod(runnerSA, runnerOwner), "p", kcm), admit},
		{"controller creates a pod owned by DaemonSet evil", create(podsGVR, pod(runnerSA, owner("DaemonSet", evilDSName, true)), "p", dsController), msgPod},
		{"controller creates a pod owned by a ReplicaSet", create(podsGVR, pod(runnerSA, owner(replicaSetRef, runnerDSName, true)), "p", kcm), msgPod},
		{"owner reference is not the controller", create(podsGVR, pod(runnerSA, owner("DaemonSet", runnerDSName, false)), "p", dsController), msgPod},
		{"owner reference of another API version", create(podsGVR, pod(runnerSA, metav1.OwnerReference{APIVersion: "extensions/v1beta1", Kind: "DaemonSet", Name: runnerDSName, Controller: ptrTrue()}), "p", dsController), msgPod},
		{"controller creates an ownerless Runner pod", create(podsGVR, pod(runnerSA), "p", dsController), msgPod},
		{"edit user creates a Runner pod with the right owner", create(podsGVR, pod(runnerSA, runnerOwner), "p", editUser), msgPod},
		{"edit user creates a pod with another ServiceAccount", create(podsGVR, pod(otherSA), "p", editUser), admit},
		{"edit user creates a pod with no ServiceAccount", create(podsGVR, pod(""), "p", editUser), admit},

		// Validation 4: only deployers create or change the DaemonSet.
		{"deployer creates the DaemonSet", create(dsGVR, daemonSet(runnerDSName, runnerSA), runnerDSName, kustomize), admit},
		{"edit user creates the DaemonSet", create(dsGVR, daemonSet(runnerDSName, runnerSA), runnerDSName, editUser), msgDeployer},
		{"edit user changes the DaemonSet's spec", dsUpdate(editUser, true), msgDeployer},
		{"edit user updates only the DaemonSet's metadata", dsUpdate(editUser, false), admit},
		{"deployer changes the DaemonSet's spec", dsUpdate(kustomize, true), admit},

		// Validation 3: no other workload template names the ServiceAccount.
		{"deployer creates DaemonSet evil with the Runner ServiceAccount", create(dsGVR, daemonSet(evilDSName, runnerSA), evilDSName, kustomize), msgSA},
		{"edit user creates DaemonSet evil with another ServiceAccount", create(dsGVR, daemonSet(evilDSName, otherSA), evilDSName, editUser), admit},
	}
	// Every other workload kind, with and without the Runner ServiceAccount:
	// exercises each podSpec branch on a real object of that kind.
	for _, sa := range []string{runnerSA, otherSA, ""} {
		want := admit
		if sa == runnerSA {
			want = msgSA
		}
		objs := map[string]runtime.Object{
			"deployments":            &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: podTemplate(sa)}},
			"replicasets":            &appsv1.ReplicaSet{Spec: appsv1.ReplicaSetSpec{Template: podTemplate(sa)}},
			"statefulsets":           &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Template: podTemplate(sa)}},
			"replicationcontrollers": &corev1.ReplicationController{Spec: corev1.ReplicationControllerSpec{Template: ptrTo(podTemplate(sa))}},
			"jobs":                   &batchv1.Job{Spec: batchv1.JobSpec{Template: podTemplate(sa)}},
			"cronjobs":               &batchv1.CronJob{Spec: batchv1.CronJobSpec{Schedule: "* * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: podTemplate(sa)}}}},
		}
		for gvr := range matchedKinds {
			obj, ok := objs[gvr.Resource]
			if !ok {
				continue
			}
			for _, op := range []admission.Operation{admission.Create, admission.Update} {
				r := create(gvr, obj, "w", kustomize)
				r.op = op
				if op == admission.Update {
					r.old = obj
				}
				tests = append(tests, struct {
					name string
					req  request
					want string
				}{gvr.Resource + " " + string(op) + " with ServiceAccount " + sa, r, want})
			}
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := evaluate(t, v, tt.req); got != tt.want {
				t.Fatalf("decision = %q, want %q (empty: admitted)", got, tt.want)
			}
		})
	}
}

// TestPolicyCEL_EvaluationFollowsParameters: the rendered controllers and
// deployers are the ones the policy enforces.
func TestPolicyCEL_EvaluationFollowsParameters(t *testing.T) {
	p := DefaultParams()
	p.Controllers = []string{kcm}
	p.Deployers = []string{"system:serviceaccount:flux-system:runner-deployer"}
	v := newValidator(t, runnerPolicy(t, rendered(t, p)))
	runnerOwner := owner("DaemonSet", runnerDSName, true)
	if got := evaluate(t, v, create(podsGVR, pod(runnerSA, runnerOwner), "p", dsController)); got != msgPod {
		t.Fatalf("narrowed controllers: daemon-set-controller decision = %q, want %q", got, msgPod)
	}
	if got := evaluate(t, v, create(podsGVR, pod(runnerSA, runnerOwner), "p", kcm)); got != admit {
		t.Fatalf("narrowed controllers: kube-controller-manager decision = %q, want admit", got)
	}
	if got := evaluate(t, v, create(dsGVR, daemonSet(runnerDSName, runnerSA), runnerDSName, kustomize)); got != msgDeployer {
		t.Fatalf("custom deployers: kustomize-controller decision = %q, want %q", got, msgDeployer)
	}
	if got := evaluate(t, v, create(dsGVR, daemonSet(runnerDSName, runnerSA), runnerDSName, p.Deployers[0])); got != admit {
		t.Fatalf("custom deployers: %s decision = %q, want admit", p.Deployers[0], got)
	}
	if !strings.HasPrefix(p.Deployers[0], "system:serviceaccount:") {
		t.Fatal("test setup")
	}
}

func ptrTrue() *bool      { b := true; return &b }
func ptrTo[T any](v T) *T { return &v }
