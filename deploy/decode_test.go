package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// newTyped returns an empty object of the k8s.io/api type for apiVersion and
// kind, or an error for a kind the stream has no business containing.
func newTyped(apiVersion, kind string) (runtime.Object, error) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "batch/v1/CronJob":
		return &batchv1.CronJob{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
		return &admissionregistrationv1.ValidatingAdmissionPolicy{}, nil
	case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, nil
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule":
		// No Go type in the module's dependencies: decoded as is, and the
		// tests check its fields (serviceMonitorSpec).
		return &unstructured.Unstructured{}, nil
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	}
	return nil, fmt.Errorf("unexpected kind %s %s", apiVersion, kind)
}

// decodeStrict splits a multi-document YAML stream and decodes every
// non-empty document into its k8s.io/api type with sigs.k8s.io/yaml's strict
// decoder: an unknown or duplicated field is an error.
func decodeStrict(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if tm.APIVersion == "" && tm.Kind == "" {
			var any map[string]any
			if err := yaml.Unmarshal(doc, &any); err != nil || len(any) != 0 {
				return nil, fmt.Errorf("document %d has no apiVersion and kind", i)
			}
			continue // comments only
		}
		obj, err := newTyped(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
}

// rendered renders p and decodes it strictly, failing the test on any error.
func rendered(t *testing.T, p Params) []runtime.Object {
	t.Helper()
	out, err := Render(p)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	objs, err := decodeStrict(out)
	if err != nil {
		t.Fatalf("strict decode: %v", err)
	}
	return objs
}

// only returns the single object of type T named name, failing otherwise.
func only[T interface {
	runtime.Object
	GetName() string
	GetNamespace() string
}](t *testing.T, objs []runtime.Object, namespace, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok && v.GetName() == name && v.GetNamespace() == namespace {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T %s/%s, found %d", zero, namespace, name, len(found))
	}
	return found[0]
}

func TestDecodeStrict_RefusesUnknownAndDuplicateFields(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"unknown field", "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\nautomountServiceAcountToken: false\n", "unknown field"},
		{"unknown nested field", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: a\nspec:\n  updateStrategy:\n    rollingUpdate:\n      maxSurg: 0\n", "unknown field"},
		{"duplicate field", "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  name: b\n", "already set"},
		{"unexpected kind", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n", "unexpected kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decodeStrict error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
