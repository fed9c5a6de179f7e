package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// dl440Validations is DL-440 §DaemonSet change's four validations, copied
// verbatim from the record (expressions and messages).
var dl440Validations = []admissionregistrationv1.Validation{
	{
		Expression: `variables.res != 'serviceaccounts' || request.name != 'compass-runner' ||
        request.userInfo.username.startsWith('system:node:')`,
		Message: "only kubelets may request a compass-runner token",
	},
	{
		Expression: `variables.res != 'pods' || !variables.usesRunnerSA ||
        (request.userInfo.username in variables.controllers &&
         has(object.metadata.ownerReferences) &&
         object.metadata.ownerReferences.exists(r,
           has(r.controller) && r.controller && r.apiVersion == 'apps/v1' &&
           r.kind == 'DaemonSet' && r.name == 'compass-runner'))`,
		Message: "compass-runner pods must come from the compass-runner DaemonSet",
	},
	{
		Expression: `variables.res in ['pods', 'serviceaccounts'] || variables.isRunnerDS ||
        !variables.usesRunnerSA`,
		Message: "only the compass-runner DaemonSet may use the compass-runner ServiceAccount",
	},
	{
		Expression: `!variables.isRunnerDS || request.userInfo.username in variables.deployers ||
        (request.operation == 'UPDATE' && object.spec == oldObject.spec)`,
		Message: "only a deployer may create or change the compass-runner DaemonSet",
	},
}

// dl440Variables is the record's spec.variables, controllers and deployers
// at their defaults.
var dl440Variables = []admissionregistrationv1.Variable{
	{Name: "controllers", Expression: `['system:serviceaccount:kube-system:daemon-set-controller',
         'system:kube-controller-manager']`},
	{Name: "deployers", Expression: `['system:serviceaccount:flux-system:kustomize-controller']`},
	{Name: "res", Expression: `request.resource.resource`},
	{Name: "podSpec", Expression: `variables.res == 'pods' ? object.spec
        : variables.res == 'cronjobs' ? object.spec.jobTemplate.spec.template.spec
        : object.spec.template.spec`},
	{Name: "usesRunnerSA", Expression: `has(variables.podSpec.serviceAccountName) &&
        variables.podSpec.serviceAccountName == 'compass-runner'`},
	{Name: "isRunnerDS", Expression: `variables.res == 'daemonsets' && object.metadata.name == 'compass-runner'`},
}

// normalize collapses every run of whitespace to one space.
func normalize(s string) string { return strings.Join(strings.Fields(s), " ") }

func TestRender_PolicyValidationsAreDL440s(t *testing.T) {
	pol := renderedPolicy(t)
	if len(pol.Spec.Validations) != len(dl440Validations) {
		t.Fatalf("%d validations, want DL-440's %d", len(pol.Spec.Validations), len(dl440Validations))
	}
	for i, want := range dl440Validations {
		got := pol.Spec.Validations[i]
		if normalize(got.Expression) != normalize(want.Expression) {
			t.Errorf("validation %d expression:\n got %s\nwant %s", i, normalize(got.Expression), normalize(want.Expression))
		}
		if got.Message != want.Message || got.MessageExpression != "" || got.Reason != nil {
			t.Errorf("validation %d: message %q (expression %q, reason %v), want %q", i, got.Message, got.MessageExpression, got.Reason, want.Message)
		}
	}
	if len(pol.Spec.Variables) != len(dl440Variables) {
		t.Fatalf("%d variables, want DL-440's %d", len(pol.Spec.Variables), len(dl440Variables))
	}
	for i, want := range dl440Variables {
		got := pol.Spec.Variables[i]
		if got.Name != want.Name || normalize(got.Expression) != normalize(want.Expression) {
			t.Errorf("variable %d = %s: %s, want %s: %s", i, got.Name, normalize(got.Expression), want.Name, normalize(want.Expression))
		}
	}
	checkPolicyShape(t, pol, "compass-runner")
}

// checkPolicyShape checks everything of the policy but its variables and
// validations against DL-440: failure policy, match constraints, no params.
func checkPolicyShape(t *testing.T, pol *admissionregistrationv1.ValidatingAdmissionPolicy, namespace string) {
	t.Helper()
	if pol.APIVersion != "admissionregistration.k8s.io/v1" {
		t.Fatalf("apiVersion %q", pol.APIVersion)
	}
	if pol.Spec.FailurePolicy == nil || *pol.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Fatalf("failurePolicy = %v, want Fail", pol.Spec.FailurePolicy)
	}
	if pol.Spec.ParamKind != nil || len(pol.Spec.MatchConditions) != 0 || len(pol.Spec.AuditAnnotations) != 0 {
		t.Fatal("the policy has a paramKind, matchConditions or auditAnnotations DL-440 does not")
	}
	rule := func(groups []string, ops []admissionregistrationv1.OperationType, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: groups, APIVersions: []string{"v1"}, Resources: resources},
		}}
	}
	c := []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
	cu := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	want := &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": namespace}},
		ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
			rule([]string{""}, c, "pods", "serviceaccounts/token"),
			rule([]string{""}, cu, "replicationcontrollers"),
			rule([]string{"apps"}, cu, "daemonsets", "deployments", "replicasets", "statefulsets"),
			rule([]string{"batch"}, cu, "jobs", "cronjobs"),
		},
	}
	if !reflect.DeepEqual(pol.Spec.MatchConstraints, want) {
		t.Fatalf("matchConstraints = %+v\nwant %+v", pol.Spec.MatchConstraints, want)
	}
}

func TestRender_PolicyBinding(t *testing.T) {
	for name, p := range map[string]Params{"default": DefaultParams(), "custom": customParams(t)} {
		t.Run(name, func(t *testing.T) {
			objs := rendered(t, p)
			b := only[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "", PolicyName)
			if b.Spec.PolicyName != PolicyName {
				t.Fatalf("policyName = %q", b.Spec.PolicyName)
			}
			if !reflect.DeepEqual(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
				t.Fatalf("validationActions = %v, want [Deny]", b.Spec.ValidationActions)
			}
			if b.Spec.ParamRef != nil || b.Spec.MatchResources != nil {
				t.Fatal("the binding narrows or parameterises the policy")
			}
			checkPolicyShape(t, runnerPolicy(t, objs), p.Namespace)
		})
	}
}

// designRecord is DL-440 in the shared folder beside the repository (CI lays
// a copy of shared/ beside its clone).
const designRecord = "../../shared/seeds/000_6ff1e45af7124ed8.txt"

// TestRender_PolicyEqualsDesignRecord decodes the policy and binding straight
// out of DL-440's text and compares the rendering with them.
func TestRender_PolicyEqualsDesignRecord(t *testing.T) {
	text, err := os.ReadFile(designRecord)
	if os.IsNotExist(err) {
		abs, _ := filepath.Abs(designRecord)
		t.Skipf("DL-440 not found at %s; the verbatim copy in TestRender_PolicyValidationsAreDL440s still applies", abs)
	}
	if err != nil {
		t.Fatal(err)
	}
	start := bytes.Index(text, []byte("apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n"))
	end := bytes.Index(text, []byte("\nNATS-plane credentials"))
	if start < 0 || end < start {
		t.Fatal("DL-440's policy block not found in the record")
	}
	objs, err := decodeStrict(text[start:end])
	if err != nil {
		t.Fatalf("DL-440's own YAML does not decode strictly: %v", err)
	}
	if len(objs) != 2 {
		t.Fatalf("DL-440 block has %d objects, want policy and binding", len(objs))
	}
	recPol, ok1 := objs[0].(*admissionregistrationv1.ValidatingAdmissionPolicy)
	recBinding, ok2 := objs[1].(*admissionregistrationv1.ValidatingAdmissionPolicyBinding)
	if !ok1 || !ok2 {
		t.Fatalf("DL-440 block kinds %T, %T", objs[0], objs[1])
	}
	mine := rendered(t, DefaultParams())
	pol := runnerPolicy(t, mine)
	binding := only[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, mine, "", PolicyName)

	normVars := func(vs []admissionregistrationv1.Variable) []admissionregistrationv1.Variable {
		out := make([]admissionregistrationv1.Variable, len(vs))
		for i, v := range vs {
			out[i] = admissionregistrationv1.Variable{Name: v.Name, Expression: normalize(v.Expression)}
		}
		return out
	}
	normVals := func(vs []admissionregistrationv1.Validation) []admissionregistrationv1.Validation {
		out := make([]admissionregistrationv1.Validation, len(vs))
		for i, v := range vs {
			v.Expression = normalize(v.Expression)
			out[i] = v
		}
		return out
	}
	if got, want := normVals(pol.Spec.Validations), normVals(recPol.Spec.Validations); !reflect.DeepEqual(got, want) {
		t.Errorf("validations differ from DL-440:\n got %+v\nwant %+v", got, want)
	}
	if got, want := normVars(pol.Spec.Variables), normVars(recPol.Spec.Variables); !reflect.DeepEqual(got, want) {
		t.Errorf("variables differ from DL-440:\n got %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(pol.Spec.MatchConstraints, recPol.Spec.MatchConstraints) {
		t.Errorf("matchConstraints differ from DL-440:\n got %+v\nwant %+v", pol.Spec.MatchConstraints, recPol.Spec.MatchConstraints)
	}
	if !reflect.DeepEqual(pol.Spec.FailurePolicy, recPol.Spec.FailurePolicy) || pol.Name != recPol.Name {
		t.Errorf("name or failurePolicy differ from DL-440")
	}
	if !reflect.DeepEqual(binding.Spec, recBinding.Spec) || binding.Name != recBinding.Name {
		t.Errorf("binding differs from DL-440:\n got %+v\nwant %+v", binding.Spec, recBinding.Spec)
	}
}
