package deploy

// The policy's CEL, checked with the API server's own code (k8s.io/apiserver
// v0.37.2), in three ways:
//
//  1. compileAdmission: the composited compiler the validating admission
//     plugin builds for every policy (plugin.go compilePolicy), in both the
//     NewExpressions environment (what a create or update of the policy is
//     validated against) and the StoredExpressions environment (what
//     admission runs). object/oldObject are dynamically typed there, as in
//     the API server; request, namespaceObject and variables are typed.
//  2. typeCheckSchema: the plugin's TypeChecker (what fills
//     status.typeChecking) with object/oldObject typed from the OpenAPI v3
//     schemas of the eight matched kinds (client-go's embedded openapitest
//     documents for core/v1, apps/v1 and batch/v1), plus a per-kind check of
//     each branch of the podSpec variable. The TypeChecker checks validations
//     only, never variables; and podSpec as a whole cannot type-check against
//     any single kind (typed as a Pod, object.spec.template is undefined;
//     typed as a DaemonSet, object.spec.jobTemplate is), because it dispatches
//     on request.resource at run time. So each branch is checked against the
//     kinds it serves instead.
//  3. evaluation: the plugin's Validator evaluating the rendered policy on
//     admission attributes for every matched kind (TestPolicyCEL_Evaluation).

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	celgo "github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/parser"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/openapi"
	"k8s.io/client-go/openapi/openapitest"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// matchedKinds are the kinds the policy's resourceRules name (the
// serviceaccounts/token subresource is skipped by the TypeChecker, as by
// the API server, and exercised by evaluation instead).
var matchedKinds = map[schema.GroupVersionResource]schema.GroupVersionKind{
	{Version: "v1", Resource: "pods"}:                        {Version: "v1", Kind: "Pod"},
	{Version: "v1", Resource: "replicationcontrollers"}:      {Version: "v1", Kind: "ReplicationController"},
	{Group: "apps", Version: "v1", Resource: "daemonsets"}:   {Group: "apps", Version: "v1", Kind: "DaemonSet"},
	{Group: "apps", Version: "v1", Resource: "deployments"}:  {Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "apps", Version: "v1", Resource: "replicasets"}:  {Group: "apps", Version: "v1", Kind: "ReplicaSet"},
	{Group: "apps", Version: "v1", Resource: "statefulsets"}: {Group: "apps", Version: "v1", Kind: "StatefulSet"},
	{Group: "batch", Version: "v1", Resource: "jobs"}:        {Group: "batch", Version: "v1", Kind: "Job"},
	{Group: "batch", Version: "v1", Resource: "cronjobs"}:    {Group: "batch", Version: "v1", Kind: "CronJob"},
}

// compileAdmission compiles every variable and validation of pol the way the
// validating admission plugin does, and returns one line per problem.
func compileAdmission(pol *admissionregistrationv1.ValidatingAdmissionPolicy) []string {
	var problems []string
	for _, mode := range []environment.Type{environment.NewExpressions, environment.StoredExpressions} {
		compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
		if err != nil {
			return []string{fmt.Sprintf("composited compiler: %v", err)}
		}
		opts := plugincel.OptionalVariableDeclarations{HasParams: pol.Spec.ParamKind != nil, HasAuthorizer: true}
		for _, v := range pol.Spec.Variables {
			res := compiler.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, opts, mode)
			if res.Error != nil {
				problems = append(problems, fmt.Sprintf("%s: variable %s: %v", mode, v.Name, res.Error))
			}
		}
		for i, v := range pol.Spec.Validations {
			res := compiler.CompileCELExpression(&validating.ValidationCondition{Expression: v.Expression, Message: v.Message}, opts, mode)
			switch {
			case res.Error != nil:
				problems = append(problems, fmt.Sprintf("%s: validation %d: %v", mode, i, res.Error))
			case !res.OutputType.IsExactType(celgo.BoolType):
				problems = append(problems, fmt.Sprintf("%s: validation %d: type %v, want bool", mode, i, res.OutputType))
			}
		}
	}
	return problems
}

// openAPIDiscovery serves client-go's embedded OpenAPI v3 documents to the
// API server's ClientDiscoveryResolver; only OpenAPIV3 is ever called.
type openAPIDiscovery struct {
	discovery.DiscoveryInterface
	client openapi.Client
}

func (d openAPIDiscovery) OpenAPIV3() openapi.Client { return d.client }

// cachedResolver resolves each kind's schema once: the discovery resolver
// parses a whole OpenAPI document (megabytes) on every call. Resolved schemas
// are only read by the TypeChecker.
type cachedResolver struct {
	inner resolver.SchemaResolver
	mu    sync.Mutex
	m     map[schema.GroupVersionKind]*spec.Schema
}

func (c *cachedResolver) ResolveSchema(gvk schema.GroupVersionKind) (*spec.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[gvk]; ok {
		return s, nil
	}
	s, err := c.inner.ResolveSchema(gvk)
	if err != nil {
		return nil, err
	}
	c.m[gvk] = s
	return s, nil
}

var schemas = &cachedResolver{
	inner: &resolver.ClientDiscoveryResolver{Discovery: openAPIDiscovery{client: openapitest.NewEmbeddedFileClient()}},
	m:     map[schema.GroupVersionKind]*spec.Schema{},
}

func newTypeChecker() *validating.TypeChecker {
	mapper := meta.NewDefaultRESTMapper(nil)
	for _, gvk := range matchedKinds {
		mapper.Add(gvk, meta.RESTScopeNamespace)
	}
	return &validating.TypeChecker{SchemaResolver: schemas, RestMapper: mapper}
}

// typeCheckSchema runs the API server's TypeChecker on pol with schema-typed
// object/oldObject, then checks each podSpec branch against the kinds it
// serves. It returns one line per problem.
func typeCheckSchema(pol *admissionregistrationv1.ValidatingAdmissionPolicy) []string {
	tc := newTypeChecker()
	var problems []string
	for _, w := range tc.Check(pol) {
		problems = append(problems, fmt.Sprintf("%s: %s", w.FieldRef, strings.TrimSpace(w.Warning)))
	}
	branches, err := podSpecBranches(pol)
	if err != nil {
		return append(problems, err.Error())
	}
	for gvr := range matchedKinds {
		branch, ok := branches[gvr.Resource]
		if !ok {
			branch = branches[""]
		}
		// The branch must name a PodSpec: check the two fields the policy
		// reads from it through usesRunnerSA.
		one := singleKindPolicy(pol, gvr)
		ctx := tc.CreateContext(one)
		expr := fmt.Sprintf("has((%s).serviceAccountName) && (%s).serviceAccountName == 'x'", branch, branch)
		for _, r := range tc.CheckExpression(ctx, expr) {
			problems = append(problems, fmt.Sprintf("podSpec branch %q for %s: %s", branch, gvr.Resource, strings.TrimSpace(r.String())))
		}
	}
	return problems
}

// singleKindPolicy is pol narrowed to one resource and with no variables, so
// the TypeChecker types object as exactly that kind.
func singleKindPolicy(pol *admissionregistrationv1.ValidatingAdmissionPolicy, gvr schema.GroupVersionResource) *admissionregistrationv1.ValidatingAdmissionPolicy {
	one := pol.DeepCopy()
	one.Spec.Variables = nil
	one.Spec.MatchConstraints.ResourceRules = []admissionregistrationv1.NamedRuleWithOperations{{
		RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{gvr.Group}, APIVersions: []string{gvr.Version}, Resources: []string{gvr.Resource},
			},
		},
	}}
	return one
}

// podSpecBranches splits the podSpec variable, a chain of
// `variables.res == '<resource>' ? <branch> : ...`, into resource -> branch
// source; the final else branch is under "".
func podSpecBranches(pol *admissionregistrationv1.ValidatingAdmissionPolicy) (map[string]string, error) {
	var src string
	for _, v := range pol.Spec.Variables {
		if v.Name == "podSpec" {
			src = v.Expression
		}
	}
	env, err := celgo.NewEnv()
	if err != nil {
		return nil, err
	}
	parsed, iss := env.Parse(src)
	if iss.Err() != nil {
		return nil, fmt.Errorf("podSpec: %w", iss.Err())
	}
	info := parsed.NativeRep().SourceInfo()
	out := map[string]string{}
	e := parsed.NativeRep().Expr()
	for e.Kind() == ast.CallKind && e.AsCall().FunctionName() == operators.Conditional {
		args := e.AsCall().Args()
		cond := args[0]
		if cond.Kind() != ast.CallKind || cond.AsCall().FunctionName() != operators.Equals {
			return nil, fmt.Errorf("podSpec: condition is not variables.res == '<resource>'")
		}
		lhs, rhs := cond.AsCall().Args()[0], cond.AsCall().Args()[1]
		lhsSrc, err := parser.Unparse(lhs, info)
		if err != nil || lhsSrc != "variables.res" || rhs.Kind() != ast.LiteralKind {
			return nil, fmt.Errorf("podSpec: condition is not variables.res == '<resource>'")
		}
		res, ok := rhs.AsLiteral().Value().(string)
		if !ok {
			return nil, fmt.Errorf("podSpec: condition compares with a non-string")
		}
		if out[res], err = parser.Unparse(args[1], info); err != nil {
			return nil, err
		}
		e = args[2]
	}
	var err2 error
	if out[""], err2 = parser.Unparse(e, info); err2 != nil {
		return nil, err2
	}
	return out, nil
}

// evalStringList evaluates a constant CEL list-of-strings expression (the
// controllers and deployers variables) with plain CEL.
func evalStringList(t *testing.T, expr string) []string {
	t.Helper()
	env, err := celgo.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	a, iss := env.Compile(expr)
	if iss.Err() != nil {
		t.Fatalf("compile %q: %v", expr, iss.Err())
	}
	prg, err := env.Program(a)
	if err != nil {
		t.Fatal(err)
	}
	val, _, err := prg.Eval(celgo.NoVars())
	if err != nil {
		t.Fatalf("eval %q: %v", expr, err)
	}
	list, err := val.ConvertToNative(stringSliceType)
	if err != nil {
		t.Fatalf("%q is not a list of strings: %v", expr, err)
	}
	return list.([]string)
}

func renderedPolicy(t *testing.T) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	return runnerPolicy(t, rendered(t, DefaultParams()))
}

func TestPolicyCEL_CompilesInAdmissionEnvironment(t *testing.T) {
	for name, p := range map[string]Params{"default": DefaultParams(), "custom": customParams(t)} {
		t.Run(name, func(t *testing.T) {
			pol := runnerPolicy(t, rendered(t, p))
			if problems := compileAdmission(pol); len(problems) != 0 {
				t.Fatalf("the policy does not compile as the API server compiles it:\n%s", strings.Join(problems, "\n"))
			}
		})
	}
}

func TestPolicyCEL_TypeChecksAgainstSchemas(t *testing.T) {
	pol := renderedPolicy(t)
	if problems := typeCheckSchema(pol); len(problems) != 0 {
		t.Fatalf("schema type check:\n%s", strings.Join(problems, "\n"))
	}
	// The check is not vacuous: every matched kind's schema was resolved, so
	// a misspelt object field is reported once per kind.
	tc := newTypeChecker()
	results := tc.CheckExpression(tc.CreateContext(pol), "object.metadata.nmae == 'x'")
	var got []string
	for _, r := range results {
		if r.Issues == nil || !strings.Contains(r.Issues.Error(), "undefined field 'nmae'") {
			t.Fatalf("%v: issues %v, want undefined field 'nmae'", r.GVK, r.Issues)
		}
		got = append(got, r.GVK.Kind)
	}
	var want []string
	for _, gvk := range matchedKinds {
		want = append(want, gvk.Kind)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("type-checked kinds = %v, want %v", got, want)
	}
	branches, err := podSpecBranches(pol)
	if err != nil {
		t.Fatal(err)
	}
	wantBranches := map[string]string{
		"pods":     "object.spec",
		"cronjobs": "object.spec.jobTemplate.spec.template.spec",
		"":         "object.spec.template.spec",
	}
	if len(branches) != len(wantBranches) {
		t.Fatalf("podSpec branches = %v, want %v", branches, wantBranches)
	}
	for k, v := range wantBranches {
		if branches[k] != v {
			t.Fatalf("podSpec branches = %v, want %v", branches, wantBranches)
		}
	}
}

// TestPolicyCEL_BrokenExpressionsAreCaught mutates the rendered policy and
// checks that each kind of breakage is caught by the check meant for it.
func TestPolicyCEL_BrokenExpressionsAreCaught(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*admissionregistrationv1.ValidatingAdmissionPolicy)
		compile  bool // caught by compileAdmission
		typeChek bool // caught by typeCheckSchema
		want     string
	}{
		{"syntax error in a validation", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Validations[0].Expression += " ||"
		}, true, true, "Syntax error"},
		{"unknown variable", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Validations[2].Expression = strings.Replace(p.Spec.Validations[2].Expression, "variables.usesRunnerSA", "variables.usesRunnerSa", 1)
		}, true, true, "undefined field 'usesRunnerSa'"},
		{"misspelt request field", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Validations[0].Expression = strings.Replace(p.Spec.Validations[0].Expression, "request.userInfo.username", "request.userInfo.usrname", 1)
		}, true, true, "undefined field 'usrname'"},
		{"non-bool validation", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Validations[3].Expression = "variables.res"
		}, true, false, "must evaluate to bool"},
		{"unknown function in a variable", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Variables[4].Expression = "variables.res.startsWit('x')"
		}, true, false, "undeclared reference to 'startsWit'"},
		{"misspelt object field in a validation", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Validations[1].Expression = strings.Replace(p.Spec.Validations[1].Expression, "object.metadata.ownerReferences.exists", "object.metadata.ownerRefs.exists", 1)
		}, false, true, "undefined field 'ownerRefs'"},
		{"wrong podSpec path for cronjobs", func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Spec.Variables[3].Expression = strings.Replace(p.Spec.Variables[3].Expression, "object.spec.jobTemplate.spec.template.spec", "object.spec.jobTemplate.template.spec", 1)
		}, false, true, "undefined field 'template'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := renderedPolicy(t)
			tt.mutate(pol)
			compileProblems := strings.Join(compileAdmission(pol), "\n")
			typeProblems := strings.Join(typeCheckSchema(pol), "\n")
			if got := compileProblems != ""; got != tt.compile {
				t.Fatalf("compileAdmission caught it: %v, want %v\n%s", got, tt.compile, compileProblems)
			}
			if got := typeProblems != ""; got != tt.typeChek {
				t.Fatalf("typeCheckSchema caught it: %v, want %v\n%s", got, tt.typeChek, typeProblems)
			}
			if !strings.Contains(compileProblems+"\n"+typeProblems, tt.want) {
				t.Fatalf("problems do not mention %q:\n%s\n%s", tt.want, compileProblems, typeProblems)
			}
		})
	}
}
