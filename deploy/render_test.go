package deploy

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/compass-runner/identity/test/natsembed"
)

// update regenerates the checked-in rendering: go test ./deploy -run TestCheckedIn -update
// (or COMPASS_UPDATE_MANIFESTS=1).
var update = flag.Bool("update", false, "rewrite deploy/kubernetes/compass-runner.yaml from Render(DefaultParams())")

const checkedIn = "kubernetes/compass-runner.yaml"

func runnerDaemonSet(t *testing.T, objs []runtime.Object, ns string) *appsv1.DaemonSet {
	t.Helper()
	return only[*appsv1.DaemonSet](t, objs, ns, RunnerDaemonSet)
}

func runnerPolicy(t *testing.T, objs []runtime.Object) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	return only[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "", PolicyName)
}

func TestCheckedInManifestsMatchRender(t *testing.T) {
	want, err := Render(DefaultParams())
	if err != nil {
		t.Fatalf("Render(DefaultParams()): %v", err)
	}
	if *update || os.Getenv("COMPASS_UPDATE_MANIFESTS") != "" {
		if err := os.MkdirAll(filepath.Dir(checkedIn), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(checkedIn, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(checkedIn)
	if err != nil {
		t.Fatalf("read %s: %v (regenerate with: go test ./deploy -run TestCheckedInManifestsMatchRender -update)", checkedIn, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("deploy/%s drifted from Render(DefaultParams()); regenerate with: go test ./deploy -run TestCheckedInManifestsMatchRender -update", checkedIn)
	}
	if _, err := decodeStrict(got); err != nil {
		t.Fatalf("checked-in manifests do not decode strictly: %v", err)
	}
}

func TestRender_Deterministic(t *testing.T) {
	a, err := Render(DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Render(DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two renderings of the same parameters differ")
	}
}

func TestRender_EveryDocumentDecodesStrictly(t *testing.T) {
	withNATS := DefaultParams()
	withNATS.NATSImage = "nats:2.12.1-alpine"
	loopbackNATS := withNATS
	loopbackNATS.NATSURL = "nats://127.0.0.1:4222"
	natsCluster := withNATS
	natsCluster.NATSCluster = true
	natsCluster.NATSMonitor = NATSMonitorPod
	custom := customParams(t)
	sqliteServer := natsCluster
	sqliteServer.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	sqliteServer.ServiceMonitor = true
	postgresServer := custom
	postgresServer.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	postgresServer.ServerDatabaseSecret = "compass-server-database"
	postgresServer.DatabaseCIDR = "10.20.0.0/16"
	noPolicies := withNATS
	noPolicies.NetworkPolicies = false
	for name, p := range map[string]Params{"default": DefaultParams(), "in-cluster NATS": withNATS, "nats:// to loopback": loopbackNATS,
		"NATS cluster": natsCluster, "custom": custom, "Server on SQLite, ServiceMonitors": sqliteServer,
		"Server on PostgreSQL": postgresServer, "no NetworkPolicies": noPolicies} {
		t.Run(name, func(t *testing.T) {
			objs := rendered(t, p)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[fmtKind(o)]++
			}
			want := map[string]int{
				"Namespace": 2, "ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2,
				"ServiceAccount": 2, "DaemonSet": 1, "ConfigMap": 1, "Deployment": 1,
				"PodDisruptionBudget": 1, "Service": 1,
			}
			switch {
			case p.natsServers() > 1:
				want["StatefulSet"] = 1
				want["Service"] += 2 // nats, nats-headless
				want["PodDisruptionBudget"]++
			case p.NATSImage != "":
				want["Deployment"]++
				want["Service"]++
			}
			if p.NetworkPolicies {
				// compass-callout, compass-runner, and a default deny in
				// each namespace
				want["NetworkPolicy"] = 4
				if p.NATSImage != "" {
					want["NetworkPolicy"]++
				}
			}
			if p.ServiceMonitor {
				want["ServiceMonitor"] = 1
				want["PodMonitor"] = 1
			}
			if p.ServerImage != "" {
				want["ServiceAccount"]++
				want["PodDisruptionBudget"]++
				want["Service"] += 2 // door, metrics
				if p.ServerDatabaseSecret != "" {
					want["Deployment"]++
				} else {
					// SQLite: the callout runs in the Server's pod, not in
					// a Deployment with a PDB of its own.
					want["StatefulSet"]++
					if want["Deployment"]--; want["Deployment"] == 0 {
						delete(want, "Deployment")
					}
					want["PodDisruptionBudget"]--
				}
				if p.NetworkPolicies {
					want["NetworkPolicy"] += 2 // the Server, the migrate Job
				}
				if p.ServiceMonitor {
					want["ServiceMonitor"]++
				}
			}
			if !equalMaps(kinds, want) {
				t.Fatalf("kinds = %v, want %v", kinds, want)
			}
		})
	}
}

func fmtKind(o runtime.Object) string {
	switch v := o.(type) {
	case *corev1.Namespace:
		return "Namespace"
	case *corev1.ServiceAccount:
		return "ServiceAccount"
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *corev1.Service:
		return "Service"
	case *corev1.Secret:
		return "Secret"
	case *appsv1.DaemonSet:
		return "DaemonSet"
	case *appsv1.Deployment:
		return "Deployment"
	case *appsv1.StatefulSet:
		return "StatefulSet"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		return "ValidatingAdmissionPolicy"
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		return "ValidatingAdmissionPolicyBinding"
	case *networkingv1.NetworkPolicy:
		return "NetworkPolicy"
	case *unstructured.Unstructured:
		if v.GetAPIVersion() == "monitoring.coreos.com/v1" {
			switch k := v.GetKind(); k {
			case "ServiceMonitor", "PodMonitor", "PrometheusRule":
				return k
			}
		}
	}
	return o.GetObjectKind().GroupVersionKind().Kind + "?"
}

func equalMaps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// customParams differs from DefaultParams in every parameter.
func customParams(t *testing.T) Params {
	t.Helper()
	p := DefaultParams()
	p.Namespace = "runners"
	p.CalloutNamespace = "compass-auth"
	p.ClusterName = "-edge-7"
	p.RunnerImage = "registry.example.com:5000/team/compass-runner@sha256:" + strings.Repeat("ab", 32)
	p.CalloutImage = "registry.example.com/compass-callout:1.2.3"
	p.ServerURL = "https://compass.internal.example:9443/door"
	p.NATSURL = "tls://nats-a.example:4222,tls://nats-b.example:4222"
	p.MaxTokenLifetime = 2 * time.Hour
	p.TokenExpiration = time.Hour
	p.Controllers = []string{"system:kube-controller-manager"}
	p.Deployers = []string{"system:serviceaccount:flux-system:runner-deployer", "admin@example.com"}
	p.PriorityClassName = "system-node-critical"
	p.CalloutReplicas = 3
	p.CABundleConfigMap = "compass-ca"
	p.NATSAccount = "COMPASS"
	p.NATSCalloutIssuer = publicKey(t, nkeys.CreateAccount)
	p.NATSCalloutXKey = publicKey(t, nkeys.CreateCurveKeys)
	return p
}

func publicKey(t *testing.T, create func() (nkeys.KeyPair, error)) string {
	t.Helper()
	_, pub := natsembed.NewKey(t, create)
	return pub
}

func TestRender_MaxSurgeZero(t *testing.T) {
	for name, p := range map[string]Params{"default": DefaultParams(), "custom": customParams(t)} {
		t.Run(name, func(t *testing.T) {
			ds := runnerDaemonSet(t, rendered(t, p), p.Namespace)
			us := ds.Spec.UpdateStrategy
			if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil {
				t.Fatalf("updateStrategy = %+v, want RollingUpdate", us)
			}
			if us.RollingUpdate.MaxSurge == nil || *us.RollingUpdate.MaxSurge != intstr.FromInt32(0) {
				t.Fatalf("maxSurge = %v, want 0 (the Runner ID is per node)", us.RollingUpdate.MaxSurge)
			}
			if us.RollingUpdate.MaxUnavailable == nil || *us.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) {
				t.Fatalf("maxUnavailable = %v, want 1", us.RollingUpdate.MaxUnavailable)
			}
		})
	}
}

func projectedToken(t *testing.T, ds *appsv1.DaemonSet) *corev1.ServiceAccountTokenProjection {
	t.Helper()
	var found []*corev1.ServiceAccountTokenProjection
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				if v.Name != "compass-runner-token" {
					t.Fatalf("projected token in volume %q, want compass-runner-token", v.Name)
				}
				found = append(found, s.ServiceAccountToken)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one projected serviceAccountToken, found %d", len(found))
	}
	return found[0]
}

func TestRender_ExpirationWithinMaxTokenLifetime(t *testing.T) {
	tests := []struct {
		name               string
		expiration, maxLft time.Duration
	}{
		{"minimum", 600 * time.Second, 600 * time.Second},
		{"below a longer lifetime", 600 * time.Second, time.Hour},
		{"equal to a longer lifetime", 3600 * time.Second, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultParams()
			p.TokenExpiration, p.MaxTokenLifetime = tt.expiration, tt.maxLft
			tok := projectedToken(t, runnerDaemonSet(t, rendered(t, p), p.Namespace))
			if tok.ExpirationSeconds == nil {
				t.Fatal("expirationSeconds unset (the API server would default it to 3600)")
			}
			got := *tok.ExpirationSeconds
			if got != int64(tt.expiration/time.Second) {
				t.Fatalf("expirationSeconds = %d, want %d", got, int64(tt.expiration/time.Second))
			}
			if got < 600 || got > int64(tt.maxLft/time.Second) {
				t.Fatalf("expirationSeconds %d outside [600, maxTokenLifetime %d]", got, int64(tt.maxLft/time.Second))
			}
			if tok.Audience != "compass-runner" || tok.Path != "token" {
				t.Fatalf("projection = %+v, want audience compass-runner, path token", tok)
			}
		})
	}
	// Beyond the lifetime and below the Kubernetes minimum are refused.
	for _, exp := range []time.Duration{601 * time.Second, 599 * time.Second} {
		p := DefaultParams()
		p.TokenExpiration = exp
		_, err := Render(p)
		if !errors.Is(err, ErrInvalidParams) || !strings.Contains(err.Error(), "token expiration") {
			t.Fatalf("Render with expiration %s: err = %v, want ErrInvalidParams naming token expiration", exp, err)
		}
	}
}

func TestRender_AutomountServiceAccountTokenFalse(t *testing.T) {
	p := DefaultParams()
	p.NATSImage = "nats:2.12.1-alpine"
	objs := rendered(t, p)
	for _, o := range objs {
		switch v := o.(type) {
		case *corev1.ServiceAccount:
			if v.AutomountServiceAccountToken == nil || *v.AutomountServiceAccountToken {
				t.Errorf("ServiceAccount %s/%s: automountServiceAccountToken = %v, want false", v.Namespace, v.Name, v.AutomountServiceAccountToken)
			}
		case *appsv1.DaemonSet:
			checkNoAPIToken(t, "DaemonSet "+v.Name, &v.Spec.Template.Spec)
		case *appsv1.Deployment:
			checkNoAPIToken(t, "Deployment "+v.Name, &v.Spec.Template.Spec)
		}
	}
	ds := runnerDaemonSet(t, objs, p.Namespace)
	if ds.Spec.Template.Spec.ServiceAccountName != RunnerServiceAccount {
		t.Fatalf("serviceAccountName = %q", ds.Spec.Template.Spec.ServiceAccountName)
	}
}

func checkNoAPIToken(t *testing.T, what string, spec *corev1.PodSpec) {
	t.Helper()
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: pod automountServiceAccountToken = %v, want false", what, spec.AutomountServiceAccountToken)
	}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(m.MountPath, "/var/run/secrets/kubernetes.io") {
				t.Errorf("%s: container %s mounts the API token directory %s", what, c.Name, m.MountPath)
			}
		}
	}
}

func TestRender_NoRoleBindingInNamespace(t *testing.T) {
	for name, p := range map[string]Params{"default": DefaultParams(), "custom": customParams(t)} {
		t.Run(name, func(t *testing.T) {
			out, err := Render(p)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeStrict(out)
			if err != nil {
				t.Fatal(err)
			}
			// No RBAC object anywhere in the stream: decodeStrict knows the
			// RBAC kinds, so one would decode and be caught here.
			if regexp.MustCompile(`(?m)^kind:\s*(Cluster)?Role(Binding)?\s*$`).Match(out) {
				t.Fatal("the stream contains an RBAC object")
			}
			// The Runner namespace holds exactly its ServiceAccount and
			// DaemonSet, and the NetworkPolicies that isolate it.
			var inRunnerNS []string
			for _, o := range objs {
				m, ok := o.(metav1.Object)
				if !ok {
					t.Fatalf("%T has no metadata", o)
				}
				if fmtKind(o) == "RoleBinding" || fmtKind(o) == "ClusterRoleBinding" || strings.HasSuffix(fmtKind(o), "?") {
					t.Fatalf("unexpected %T %s", o, m.GetName())
				}
				if m.GetNamespace() == p.Namespace {
					inRunnerNS = append(inRunnerNS, fmtKind(o)+"/"+m.GetName())
				}
			}
			slices.Sort(inRunnerNS)
			want := []string{"DaemonSet/compass-runner", "NetworkPolicy/compass-runner", "NetworkPolicy/compass-runner-default-deny", "ServiceAccount/compass-runner"}
			if !p.NetworkPolicies {
				want = []string{"DaemonSet/compass-runner", "ServiceAccount/compass-runner"}
			}
			if !slices.Equal(inRunnerNS, want) {
				t.Fatalf("objects in namespace %s = %v, want %v", p.Namespace, inRunnerNS, want)
			}
		})
	}
}

func TestRender_PolicyDefaultControllersAndDeployers(t *testing.T) {
	pol := runnerPolicy(t, rendered(t, DefaultParams()))
	controllers := evalStringList(t, variable(t, pol, "controllers"))
	deployers := evalStringList(t, variable(t, pol, "deployers"))
	wantC := []string{"system:serviceaccount:kube-system:daemon-set-controller", "system:kube-controller-manager"}
	wantD := []string{"system:serviceaccount:flux-system:kustomize-controller"}
	if !slices.Equal(controllers, wantC) {
		t.Fatalf("controllers = %q, want %q", controllers, wantC)
	}
	if !slices.Equal(deployers, wantD) {
		t.Fatalf("deployers = %q, want %q", deployers, wantD)
	}

	// Custom lists are rendered as given, in spec.variables.
	p := customParams(t)
	pol = runnerPolicy(t, rendered(t, p))
	if got := evalStringList(t, variable(t, pol, "controllers")); !slices.Equal(got, p.Controllers) {
		t.Fatalf("custom controllers = %q, want %q", got, p.Controllers)
	}
	if got := evalStringList(t, variable(t, pol, "deployers")); !slices.Equal(got, p.Deployers) {
		t.Fatalf("custom deployers = %q, want %q", got, p.Deployers)
	}
	if pol.Spec.ParamKind != nil {
		t.Fatal("the policy has a paramKind: controllers and deployers must be render parameters (DL-440)")
	}
}

func variable(t *testing.T, pol *admissionregistrationv1.ValidatingAdmissionPolicy, name string) string {
	t.Helper()
	for _, v := range pol.Spec.Variables {
		if v.Name == name {
			return v.Expression
		}
	}
	t.Fatalf("policy has no variable %q", name)
	return ""
}

func TestRender_DaemonSetAsDL440(t *testing.T) {
	p := customParams(t)
	ds := runnerDaemonSet(t, rendered(t, p), p.Namespace)
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "runner" {
		t.Fatalf("containers = %d, want one named runner", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != p.RunnerImage {
		t.Fatalf("image = %q, want %q", c.Image, p.RunnerImage)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && (e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP") {
			t.Fatalf("env %s comes from %+v; the Runner needs no secret, only its pod's IP", e.Name, e.ValueFrom)
		}
		env[e.Name] = e.Value
	}
	wantEnv := map[string]string{
		// DL-440 names the variable: the DaemonSet sets COMPASS_RUNNER_TOKEN_FILE.
		"COMPASS_RUNNER_TOKEN_FILE": "/var/run/secrets/compass/runner/token",
		"COMPASS_SERVER":            p.ServerURL,
		"COMPASS_NATS_URL":          p.NATSURL,
		"COMPASS_HEALTH_ADDR":       "[$(COMPASS_POD_IP)]:8081",
		"COMPASS_CA_FILE":           "/etc/compass/ca/ca.crt",
		"COMPASS_NATS_CA_FILE":      "/etc/compass/ca/ca.crt",
	}
	for k, v := range wantEnv {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if _, ok := env["COMPASS_RUNNER_TOKEN"]; ok {
		t.Error("COMPASS_RUNNER_TOKEN is set; it is mutually exclusive with the token file")
	}
	if _, ok := env["COMPASS_TOKEN_FILE"]; ok {
		t.Error("COMPASS_TOKEN_FILE is set; the DaemonSet names the token file by DL-440's COMPASS_RUNNER_TOKEN_FILE only")
	}
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == "compass-runner-token" {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil || mount.MountPath != "/var/run/secrets/compass/runner" || !mount.ReadOnly {
		t.Fatalf("token mount = %+v, want read-only at /var/run/secrets/compass/runner", mount)
	}
	if spec.PriorityClassName != p.PriorityClassName {
		t.Fatalf("priorityClassName = %q, want %q", spec.PriorityClassName, p.PriorityClassName)
	}
	if got := runnerDaemonSet(t, rendered(t, DefaultParams()), "compass-runner").Spec.Template.Spec.PriorityClassName; got != "" {
		t.Fatalf("default priorityClassName = %q, want none", got)
	}
	if ds.Annotations["compass-runner.io/cluster-name"] != p.ClusterName {
		t.Fatalf("cluster-name annotation = %q", ds.Annotations["compass-runner.io/cluster-name"])
	}
	sel := ds.Spec.Selector.MatchLabels
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Fatalf("selector %s=%s does not match the template's labels", k, v)
		}
	}
}

// checkContainerHardened fails the test unless c runs non-root on a
// read-only root filesystem, with no privilege (no escalation, every
// capability dropped, none added, not privileged) and RuntimeDefault
// seccomp, and with cpu and memory requests and a memory limit: a
// compromised daemon gets no more than its own process.
func checkContainerHardened(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.Privileged != nil ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("%s: container securityContext = %+v", c.Name, sc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Fatalf("%s: resources = %+v, want cpu/memory requests and a memory limit", c.Name, c.Resources)
	}
}

func TestRender_RunnerPodHardened(t *testing.T) {
	ds := runnerDaemonSet(t, rendered(t, DefaultParams()), "compass-runner")
	spec := ds.Spec.Template.Spec
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("pod securityContext = %+v, want non-root with RuntimeDefault seccomp", psc)
	}
	c := spec.Containers[0]
	checkContainerHardened(t, c)
	checkProbe(t, "liveness", c.LivenessProbe, "/healthz", "health")
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz", "health")
	if len(c.Ports) != 1 || c.Ports[0].Name != "health" || c.Ports[0].ContainerPort != 8081 {
		t.Fatalf("ports = %+v, want health 8081", c.Ports)
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Fatal("the Runner pod shares a host namespace")
	}
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, path, port string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port != intstr.FromString(port) {
		t.Fatalf("%s probe = %+v, want GET %s on port %s", what, p, path, port)
	}
}

func TestRender_CalloutDeployment(t *testing.T) {
	p := customParams(t)
	objs := rendered(t, p)
	d := only[*appsv1.Deployment](t, objs, p.CalloutNamespace, "compass-callout")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != int32(p.CalloutReplicas) || *d.Spec.Replicas < 2 {
		t.Fatalf("replicas = %v, want %d (≥ 2)", d.Spec.Replicas, p.CalloutReplicas)
	}
	spec := d.Spec.Template.Spec
	aa := spec.Affinity
	if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity = %+v, want pod anti-affinity", aa)
	}
	term := aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" || term.LabelSelector == nil ||
		term.LabelSelector.MatchLabels["app.kubernetes.io/name"] != d.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Fatalf("anti-affinity term = %+v, want hostname spread of the callout's own pods", term)
	}
	pdb := only[*policyv1.PodDisruptionBudget](t, objs, p.CalloutNamespace, "compass-callout")
	if pdb.Spec.MinAvailable == nil || *pdb.Spec.MinAvailable != intstr.FromInt32(1) {
		t.Fatalf("PDB minAvailable = %v, want 1", pdb.Spec.MinAvailable)
	}
	for k, v := range pdb.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Fatalf("PDB selector %s=%s does not select the callout pods", k, v)
		}
	}
	c := spec.Containers[0]
	if c.Image != p.CalloutImage {
		t.Fatalf("image = %q", c.Image)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9090 {
		t.Fatalf("ports = %+v, want metrics 9090", c.Ports)
	}
	checkProbe(t, "liveness", c.LivenessProbe, "/healthz", "metrics")
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz", "metrics")
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
		if !strings.HasPrefix(e.Name, "COMPASS_") {
			t.Errorf("env %s is not a COMPASS_* variable", e.Name)
		}
	}
	if env["COMPASS_NATS_CA_FILE"].Value != "/etc/compass/ca/ca.crt" {
		t.Fatalf("COMPASS_NATS_CA_FILE = %q with a CA ConfigMap", env["COMPASS_NATS_CA_FILE"].Value)
	}
	if env["COMPASS_NATS_URL"].Value != p.NATSURL || env["COMPASS_ACCOUNT"].Value != p.NATSAccount || env["COMPASS_MODE"].Value != "server-config" {
		t.Fatalf("env = %+v", env)
	}
	// Secrets are referenced by name and mounted as files.
	var secretNames []string
	for _, v := range spec.Volumes {
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					secretNames = append(secretNames, s.Secret.Name)
				}
			}
		}
	}
	slices.Sort(secretNames)
	if want := []string{"compass-callout-nats", "compass-callout-signing", "compass-callout-xkey"}; !slices.Equal(secretNames, want) {
		t.Fatalf("secrets referenced = %v, want %v", secretNames, want)
	}
	if db := env["COMPASS_DATABASE_URL"]; db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil || db.ValueFrom.SecretKeyRef.Optional == nil || !*db.ValueFrom.SecretKeyRef.Optional {
		t.Fatalf("COMPASS_DATABASE_URL = %+v, want an optional secret reference", db)
	}
	svc := only[*corev1.Service](t, objs, p.CalloutNamespace, "compass-callout-metrics")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != 9090 {
		t.Fatalf("metrics service ports = %+v", svc.Spec.Ports)
	}
	if d.Namespace == p.Namespace {
		t.Fatal("callout rendered in the Runner namespace")
	}
}

// seedRE matches an nkey seed as a whole word: 58 characters, S + key type +
// base32 (a public key is 56 characters, so it never matches).
var seedRE = regexp.MustCompile(`\bS[ANUOCPX][A-Z2-7]{56}\b`)

func TestRender_NoSecretsRendered(t *testing.T) {
	p := customParams(t)
	p.NATSImage = "nats:2.12.1-alpine"
	out, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range rendered(t, p) {
		if _, ok := o.(*corev1.Secret); ok {
			t.Fatal("a Secret is rendered")
		}
	}
	if m := seedRE.Find(out); m != nil {
		t.Fatal("the stream contains something shaped like an nkey seed")
	}
	cluster := p
	cluster.NATSCluster = true
	clusterOut, err := Render(cluster)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range rendered(t, cluster) {
		if _, ok := o.(*corev1.Secret); ok {
			t.Fatal("a Secret is rendered with a NATS cluster")
		}
	}
	if seedRE.Match(clusterOut) || !bytes.Contains(clusterOut, []byte("password: $COMPASS_NATS_ROUTE_PASSWORD")) {
		t.Fatal("the cluster's stream holds a seed, or does not read the route password from the environment")
	}
	// The pattern does recognise seeds (of both kinds the callout holds).
	for _, create := range []func() (nkeys.KeyPair, error){nkeys.CreateAccount, nkeys.CreateCurveKeys} {
		kp, err := create()
		if err != nil {
			t.Fatal(err)
		}
		seed, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		if !seedRE.Match(append([]byte("issuer: "), seed...)) {
			t.Fatal("seedRE does not match a real seed")
		}
	}
	if !bytes.Contains(out, []byte(p.NATSCalloutIssuer)) || !bytes.Contains(out, []byte(p.NATSCalloutXKey)) {
		t.Fatal("the public keys given are not in the NATS configuration")
	}
	if !bytes.Contains(out, []byte("password: $COMPASS_CALLOUT_NATS_PASSWORD")) {
		t.Fatal("the callout's NATS password is not read from the environment")
	}
}

func TestRender_InvalidParamsRefused(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Params)
		want   string // the parameter the message names
	}{
		{"empty namespace", func(p *Params) { p.Namespace = "" }, "namespace"},
		{"namespace not DNS-1123", func(p *Params) { p.Namespace = "Compass_Runner" }, "namespace"},
		{"namespace injection", func(p *Params) { p.Namespace = "a\"\nkind: RoleBinding" }, "namespace"},
		{"callout namespace equals runner namespace", func(p *Params) { p.CalloutNamespace = p.Namespace }, "callout namespace"},
		{"cluster name upper case", func(p *Params) { p.ClusterName = "Prod" }, "cluster name"},
		{"cluster name too long", func(p *Params) { p.ClusterName = strings.Repeat("a", 41) }, "cluster name"},
		{"cluster name with dot", func(p *Params) { p.ClusterName = "prod.eks" }, "cluster name"},
		{"empty runner image", func(p *Params) { p.RunnerImage = "" }, "runner image"},
		{"runner image without tag", func(p *Params) { p.RunnerImage = "ghcr.io/compass-runner/compass-runner" }, "runner image"},
		{"runner image with space", func(p *Params) { p.RunnerImage = "compass-runner:v1 --privileged" }, "runner image"},
		{"callout image with quote", func(p *Params) { p.CalloutImage = "compass-callout:v1\"" }, "callout image"},
		{"NATS image without tag", func(p *Params) { p.NATSImage = "nats" }, "NATS image"},
		{"server URL http", func(p *Params) { p.ServerURL = "http://compass.example.com" }, "server URL"},
		{"server URL empty", func(p *Params) { p.ServerURL = "" }, "server URL"},
		{"server URL with credentials", func(p *Params) { p.ServerURL = "https://u:p@compass.example.com" }, "server URL"},
		{"server URL no host", func(p *Params) { p.ServerURL = "https:///x" }, "server URL"},
		{"NATS URL http", func(p *Params) { p.NATSURL = "http://nats:4222" }, "NATS URL"},
		{"NATS URL empty", func(p *Params) { p.NATSURL = "" }, "NATS URL"},
		{"NATS URL second entry bad", func(p *Params) { p.NATSURL = "tls://a:4222,ws://b:4222" }, "NATS URL"},
		{"NATS URL with credentials", func(p *Params) { p.NATSURL = "nats://user:pass@nats:4222" }, "NATS URL"},
		{"NATS URL plaintext", func(p *Params) { p.NATSURL = "nats://nats.compass-system.svc:4222" }, "NATS URL"},
		{"NATS URL wss", func(p *Params) { p.NATSURL = "wss://nats.example.com:443" }, "NATS URL"},
		{"NATS TLS secret empty", func(p *Params) { p.NATSTLSSecret = "" }, "NATS TLS secret"},
		{"NATS TLS secret not DNS", func(p *Params) { p.NATSTLSSecret = "NATS TLS" }, "NATS TLS secret"},
		{"NATS monitor unknown", func(p *Params) { p.NATSMonitor = "public" }, "NATS monitor"},
		{"NATS replicas negative", func(p *Params) { p.NATSReplicas = -1 }, "NATS replicas"},
		{"NATS replicas above the limit", func(p *Params) { p.NATSImage = "nats:2.12.1"; p.NATSReplicas = MaxNATSReplicas + 1 }, "NATS replicas"},
		{"NATS cluster without a NATS image", func(p *Params) { p.NATSCluster = true }, "NATS replicas"},
		{"NATS route TLS secret not DNS", func(p *Params) { p.NATSImage = "nats:2.12.1"; p.NATSCluster = true; p.NATSRouteTLSSecret = "a_b" }, "NATS route TLS secret"},
		{"max token lifetime below 600s", func(p *Params) { p.MaxTokenLifetime = 599 * time.Second }, "max token lifetime"},
		{"expiration below 600s", func(p *Params) { p.TokenExpiration = 300 * time.Second }, "token expiration"},
		{"expiration above max lifetime", func(p *Params) { p.TokenExpiration = 3600 * time.Second }, "token expiration"},
		{"expiration fractional", func(p *Params) { p.MaxTokenLifetime = time.Hour; p.TokenExpiration = 700500 * time.Millisecond }, "token expiration"},
		{"controllers empty", func(p *Params) { p.Controllers = nil }, "controllers"},
		{"controllers with quote", func(p *Params) { p.Controllers = []string{"system:kube-controller-manager', 'x"} }, "controllers"},
		{"controllers with backslash", func(p *Params) { p.Controllers = []string{`a\`} }, "controllers"},
		{"controllers with newline", func(p *Params) { p.Controllers = []string{"a\nb"} }, "controllers"},
		{"controllers with double quote", func(p *Params) { p.Controllers = []string{`a"b`} }, "controllers"},
		{"controllers duplicated", func(p *Params) { p.Controllers = []string{"a", "a"} }, "controllers"},
		{"controllers empty entry", func(p *Params) { p.Controllers = []string{""} }, "controllers"},
		{"controllers padded", func(p *Params) { p.Controllers = []string{" a"} }, "controllers"},
		{"deployers empty", func(p *Params) { p.Deployers = []string{} }, "deployers"},
		{"deployers with quote", func(p *Params) { p.Deployers = []string{"it's"} }, "deployers"},
		{"deployers with tab", func(p *Params) { p.Deployers = []string{"a\tb"} }, "deployers"},
		{"deployers too many", func(p *Params) { p.Deployers = manyUsers(maxUsers + 1) }, "deployers"},
		{"priority class not DNS", func(p *Params) { p.PriorityClassName = "High Priority" }, "priority class"},
		{"CA ConfigMap not DNS", func(p *Params) { p.CABundleConfigMap = "CA Bundle" }, "CA bundle ConfigMap"},
		{"callout replicas 1", func(p *Params) { p.CalloutReplicas = 1 }, "callout replicas"},
		{"NATS account with space", func(p *Params) { p.NATSAccount = "A B" }, "NATS account"},
		{"NATS account reserved", func(p *Params) { p.NATSAccount = "AUTH" }, "NATS account"},
		{"NATS issuer not an account key", func(p *Params) { p.NATSCalloutIssuer = publicKey(t, nkeys.CreateUser) }, "NATS callout issuer"},
		{"NATS xkey not a curve key", func(p *Params) { p.NATSCalloutXKey = publicKey(t, nkeys.CreateAccount) }, "NATS callout xkey"},
		{"server image without tag", func(p *Params) { p.ServerImage = "ghcr.io/compass-runner/compass-server" }, "server image"},
		{"server database secret without server image", func(p *Params) { p.ServerDatabaseSecret = "db" }, "server image"},
		{"server replicas without server image", func(p *Params) { p.ServerReplicas = 2 }, "server image"},
		{"server database secret not DNS", func(p *Params) { *p = postgresServerParams(); p.ServerDatabaseSecret = "DB URL" }, "server database secret"},
		{"server replicas 2 on SQLite", func(p *Params) { *p = sqliteServerParams(); p.ServerReplicas = 2 }, "server replicas"},
		{"server replicas negative on SQLite", func(p *Params) { *p = sqliteServerParams(); p.ServerReplicas = -1 }, "server replicas"},
		{"server replicas 1 on PostgreSQL", func(p *Params) { *p = postgresServerParams(); p.ServerReplicas = 1 }, "server replicas"},
		{"server replicas above the limit", func(p *Params) { *p = postgresServerParams(); p.ServerReplicas = MaxServerReplicas + 1 }, "server replicas"},
		{"server TLS secret empty", func(p *Params) { *p = sqliteServerParams(); p.ServerTLSSecret = "" }, "server TLS secret"},
		{"server storage without unit", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "1000" }, "server storage"},
		{"server storage injection", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "1Gi\n  x: y" }, "server storage"},
		{"door ingress CIDR not a CIDR", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.1"} }, "door ingress CIDRs"},
		{"door ingress CIDR with host bits", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.1/8"} }, "door ingress CIDRs"},
		{"door ingress CIDR twice", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.0/8", "10.0.0.0/8"} }, "door ingress CIDRs"},
		{"issuer CIDRs empty", func(p *Params) { p.IssuerCIDRs = nil }, "issuer CIDRs"},
		{"issuer CIDR injection", func(p *Params) { p.IssuerCIDRs = []string{"0.0.0.0/0\"\n"} }, "issuer CIDRs"},
		{"issuer CIDRs too many", func(p *Params) { p.IssuerCIDRs = manyCIDRs(maxCIDRs + 1) }, "issuer CIDRs"},
		{"metrics namespace not DNS", func(p *Params) { p.MetricsNamespace = "Monitoring" }, "metrics namespace"},
		{"database CIDR not a CIDR", func(p *Params) { p.DatabaseCIDR = "db.example" }, "database CIDR"},
		{"database CIDR missing on PostgreSQL", func(p *Params) { *p = postgresServerParams(); p.DatabaseCIDR = "" }, "database CIDR"},
		{"database port zero", func(p *Params) { p.DatabaseCIDR = "10.0.0.0/8"; p.DatabasePort = 0 }, "database port"},
		{"database port too big", func(p *Params) { p.DatabaseCIDR = "10.0.0.0/8"; p.DatabasePort = 65536 }, "database port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultParams()
			tt.mutate(&p)
			out, err := Render(p)
			if !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("Render error = %v, want ErrInvalidParams", err)
			}
			if out != nil {
				t.Fatal("Render returned output with an error")
			}
			if prefix := "deploy: invalid parameters: " + tt.want + ": "; !strings.HasPrefix(err.Error(), prefix) {
				t.Fatalf("error %q does not start with %q", err, prefix)
			}
			if _, err := RenderNATSConfig(p); !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("RenderNATSConfig error = %v, want ErrInvalidParams", err)
			}
		})
	}
}

func manyCIDRs(n int) []string {
	c := make([]string, n)
	for i := range c {
		c[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	return c
}

func manyUsers(n int) []string {
	u := make([]string, n)
	for i := range u {
		u[i] = "user-" + strings.Repeat("x", i+1)
	}
	return u
}

func TestManifestsCommand_RoundTrip(t *testing.T) {
	ctx := context.Background()
	var stdout, stderr bytes.Buffer
	args := []string{
		"--namespace", "runners", "--callout-namespace", "compass-auth", "--cluster-name", "prod-eks",
		"--runner-image", "example.com/runner:v2", "--callout-image", "example.com/callout:v2", "--nats-image", "nats:2.12.1",
		"--server-url", "https://compass.example.com", "--nats-url", "tls://nats:4222",
		"--max-token-lifetime", "1h", "--token-expiration", "30m",
		"--controller", "system:kube-controller-manager",
		"--deployer", "system:serviceaccount:flux-system:a", "--deployer", "system:serviceaccount:flux-system:b",
		"--priority-class", "compass-runner", "--callout-replicas", "4",
	}
	if err := ManifestsCommand(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("ManifestsCommand: %v (stderr %q)", err, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("stderr = %q, want nothing", stderr.String())
	}
	objs, err := decodeStrict(stdout.Bytes())
	if err != nil {
		t.Fatalf("strict decode of the command's output: %v", err)
	}
	ds := runnerDaemonSet(t, objs, "runners")
	if got := *projectedToken(t, ds).ExpirationSeconds; got != 1800 {
		t.Fatalf("expirationSeconds = %d, want 1800", got)
	}
	if ds.Spec.Template.Spec.PriorityClassName != "compass-runner" {
		t.Fatalf("priorityClassName = %q", ds.Spec.Template.Spec.PriorityClassName)
	}
	pol := runnerPolicy(t, objs)
	if got := evalStringList(t, variable(t, pol, "controllers")); !slices.Equal(got, []string{"system:kube-controller-manager"}) {
		t.Fatalf("controllers = %q", got)
	}
	if got := evalStringList(t, variable(t, pol, "deployers")); !slices.Equal(got, []string{"system:serviceaccount:flux-system:a", "system:serviceaccount:flux-system:b"}) {
		t.Fatalf("deployers = %q", got)
	}
	if d := only[*appsv1.Deployment](t, objs, "compass-auth", "compass-callout"); *d.Spec.Replicas != 4 {
		t.Fatalf("callout replicas = %d", *d.Spec.Replicas)
	}
	only[*appsv1.Deployment](t, objs, "compass-auth", "nats")

	// The same output as Render with the same parameters.
	p := DefaultParams()
	p.Namespace, p.CalloutNamespace, p.ClusterName = "runners", "compass-auth", "prod-eks"
	p.RunnerImage, p.CalloutImage, p.NATSImage = "example.com/runner:v2", "example.com/callout:v2", "nats:2.12.1"
	p.ServerURL, p.NATSURL = "https://compass.example.com", "tls://nats:4222"
	p.MaxTokenLifetime, p.TokenExpiration = time.Hour, 30*time.Minute
	p.Controllers = []string{"system:kube-controller-manager"}
	p.Deployers = []string{"system:serviceaccount:flux-system:a", "system:serviceaccount:flux-system:b"}
	p.PriorityClassName, p.CalloutReplicas = "compass-runner", 4
	want, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Fatal("ManifestsCommand output differs from Render with the same parameters")
	}
}

// The checked-in rendering is manifests with this installation's two
// required flags and every default.
func TestManifestsCommand_DefaultsEqualCheckedIn(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443"}
	if err := ManifestsCommand(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	want, err := Render(DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Fatal("manifests with no flags differs from Render(DefaultParams())")
	}
}

func TestManifestsCommand_Errors(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantErr    error
		wantInErr  string
		wantStderr string
	}{
		{"help", []string{"--help"}, flag.ErrHelp, "", "Usage: compass-server manifests"},
		{"no cluster name", nil, ErrInvalidParams, "cluster name: required: this cluster's name in the Server's cluster file (--cluster-name)", ""},
		{"no server URL", []string{"--cluster-name", "prod"}, ErrInvalidParams, "server URL: required: the Server's door the Runners enroll at (--server-url), https://", ""},
		{"bad parameter", []string{"--cluster-name", "prod", "--server-url", "http://x"}, ErrInvalidParams, "server URL", ""},
		{"bad controller", []string{"--cluster-name", "prod", "--server-url", "https://x.example", "--controller", "x'y"}, ErrInvalidParams, "controllers", ""},
		{"unknown flag", []string{"--nope"}, nil, "flag provided but not defined", "Usage: compass-server manifests"},
		{"bad duration", []string{"--token-expiration", "ten"}, nil, "invalid value", ""},
		{"extra argument", []string{"extra"}, nil, `unexpected argument "extra"`, "Usage: compass-server manifests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := ManifestsCommand(context.Background(), tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("ManifestsCommand succeeded")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantInErr) {
				t.Fatalf("err = %q, want it to contain %q", err, tt.wantInErr)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Fatalf("stderr = %q, want it to contain %q", stderr.String(), tt.wantStderr)
			}
			if stdout.Len() != 0 {
				t.Fatal("output written despite the error")
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ManifestsCommand(ctx, nil, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: err = %v", err)
	}
}
