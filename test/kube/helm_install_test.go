package kube

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/test/helm"
)

// TestHelmInstallAsTheGuideSays runs docs/helm.md's procedures with the
// pinned helm binary against a live API server, as a deployer identity (the
// admission policy refuses anyone else the Runner DaemonSet):
//   - helm install --create-namespace with namespaces.createCallout=false
//     creates every object, and leaves the callout namespace out of the
//     release;
//   - Upgrading: the migrate Job from helm template --show-only, then helm
//     upgrade onto the new image, which the Server's StatefulSet then runs;
//   - helm uninstall keeps the callout namespace and the operator's Secrets.
//
// There is no kubelet or controller here: what is checked is what the API
// server stores.
func TestHelmInstallAsTheGuideSays(t *testing.T) {
	bin := helm.Binary(t)
	s := startUpgradeCluster(t, requireBinaries(t), "helm-install")
	ctx := t.Context()
	kubeconfig := s.writeKubeconfig(t)
	chartDir := helm.ChartDir(t)
	as := asDeployer(kubeconfig)
	values := helm.WriteValues(t, map[string]any{
		"clusterName": "live",
		"serverURL":   "https://compass.live.example:8443",
		"natsURL":     "tls://nats.live.example:4222",
		"server":      map[string]any{"enabled": true, "image": map[string]any{"tag": "v0.1.0"}},
	})
	install := func(release string, extra ...string) helm.Result {
		args := append([]string{"install", release, chartDir, "--namespace", "compass-system", "--create-namespace", "-f", values[0]}, extra...)
		return helm.Run(t, bin, append(args, as...)...)
	}

	if r := install("compass", "--set", "namespaces.createCallout=false"); r.Err != nil {
		t.Fatalf("helm install as the guide says: %v\n%s", r.Err, r.Stderr)
	}
	// A Secret the operator created in the callout namespace, as
	// docs/self-host.md says (its content does not matter here).
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: deploy.DefaultServerTLSSecret, Namespace: "compass-system"}, StringData: map[string]string{"tls.crt": "-", "tls.key": "-"}}
	if _, err := s.cs.CoreV1().Secrets("compass-system").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds, err := s.cs.AppsV1().DaemonSets("compass-runner").Get(ctx, deploy.RunnerDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Runner DaemonSet after helm install: %v", err)
	}
	if got := ds.Annotations["compass-runner.io/cluster-name"]; got != "live" {
		t.Fatalf("DaemonSet cluster-name annotation = %q, want live", got)
	}
	if _, err := s.cs.AppsV1().Deployments("compass-system").Get(ctx, "compass-callout", metav1.GetOptions{}); err == nil {
		t.Fatal("a callout Deployment beside the Server on SQLite (the callout runs in the Server's pod, DL-452)")
	}
	if _, err := s.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, deploy.PolicyName, metav1.GetOptions{}); err != nil {
		t.Fatalf("the admission policy after helm install: %v", err)
	}
	sts := serverStatefulSet(t, s)
	if img := sts.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, "/compass-server:v0.1.0") {
		t.Fatalf("Server image after install = %s", img)
	}
	// The guide's label, on the namespace Helm created.
	ns, err := s.cs.CoreV1().Namespaces().Get(ctx, "compass-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	if owner := ns.Annotations["meta.helm.sh/release-name"]; owner != "" {
		t.Fatalf("the callout namespace belongs to release %s: helm uninstall would delete it", owner)
	}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := s.cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Upgrading: the migrate Job first, rendered apart...
	r := helm.Run(t, bin, "template", "compass", chartDir, "--namespace", "compass-system", "-f", values[0],
		"--set", "namespaces.createCallout=false", "--set", "server.image.tag=v0.2.0", "--set", "server.migrateJob=true",
		"--show-only", "templates/server-migrate-job.yaml")
	if r.Err != nil {
		t.Fatalf("helm template the migrate Job: %v\n%s", r.Err, r.Stderr)
	}
	objs, err := splitManifests(r.Stdout)
	if err != nil || len(objs) != 1 || objs[0].GetKind() != "Job" || objs[0].GetName() != deploy.ServerMigrateJob {
		t.Fatalf("the migrate Job rendering: %d objects, %v", len(objs), err)
	}
	if _, err := s.apply(ctx, objs[0], upgradeManager, false, false); err != nil {
		t.Fatalf("applying the migrate Job: %v", err)
	}
	// ...then the upgrade, which leaves the Job alone (it is no object of the release).
	r = helm.Run(t, bin, append([]string{"upgrade", "compass", chartDir, "--namespace", "compass-system", "-f", values[0],
		"--set", "namespaces.createCallout=false", "--set", "server.image.tag=v0.2.0"}, as...)...)
	if r.Err != nil {
		t.Fatalf("helm upgrade: %v\n%s", r.Err, r.Stderr)
	}
	sts = serverStatefulSet(t, s)
	if img := sts.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, "/compass-server:v0.2.0") {
		t.Fatalf("Server image after the upgrade = %s, want v0.2.0", img)
	}
	if _, err := s.cs.BatchV1().Jobs("compass-system").Get(ctx, deploy.ServerMigrateJob, metav1.GetOptions{}); err != nil {
		t.Fatalf("the migrate Job after the upgrade: %v", err)
	}
	if ns, err := s.cs.CoreV1().Namespaces().Get(ctx, "compass-system", metav1.GetOptions{}); err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Fatalf("the callout namespace after the upgrade: %v %v", err, ns.Labels)
	}

	// helm uninstall deletes the release's objects, the Runner's namespace
	// among them, and leaves the callout namespace with the operator's
	// Secrets (and a SQLite Server's volume) in it.
	if r := helm.Run(t, bin, append([]string{"uninstall", "compass", "--namespace", "compass-system"}, as...)...); r.Err != nil {
		t.Fatalf("helm uninstall: %v\n%s", r.Err, r.Stderr)
	}
	if ns, err := s.cs.CoreV1().Namespaces().Get(ctx, "compass-system", metav1.GetOptions{}); err != nil || ns.DeletionTimestamp != nil {
		t.Fatalf("the callout namespace after helm uninstall: %v (deleted at %v)", err, ns.DeletionTimestamp)
	}
	if _, err := s.cs.CoreV1().Secrets("compass-system").Get(ctx, deploy.DefaultServerTLSSecret, metav1.GetOptions{}); err != nil {
		t.Fatalf("the operator's Secret after helm uninstall: %v", err)
	}
	if ns, err := s.cs.CoreV1().Namespaces().Get(ctx, "compass-runner", metav1.GetOptions{}); err == nil && ns.DeletionTimestamp == nil {
		t.Fatal("the Runner's namespace outlived helm uninstall")
	}
}

// asDeployer are helm's flags to act as the deployer identity (the Flux
// kustomize-controller) through kubeconfig.
func asDeployer(kubeconfig string) []string {
	return helm.As(kubeconfig, deployerUser, "system:serviceaccounts", "system:serviceaccounts:flux-system")
}

func serverStatefulSet(t *testing.T, s *upgradeCluster) *appsv1.StatefulSet {
	t.Helper()
	sts, err := s.cs.AppsV1().StatefulSets("compass-system").Get(t.Context(), deploy.ServerName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Server's StatefulSet: %v", err)
	}
	return sts
}

// writeKubeconfig writes a kubeconfig with the server's admin credentials
// (system:masters, which may impersonate) for the helm binary.
func (s *apiServer) writeKubeconfig(t *testing.T) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["live"] = &clientcmdapi.Cluster{Server: s.admin.Host, CertificateAuthorityData: s.admin.CAData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: s.admin.CertData, ClientKeyData: s.admin.KeyData, Token: s.admin.BearerToken}
	cfg.Contexts["live"] = &clientcmdapi.Context{Cluster: "live", AuthInfo: "admin"}
	cfg.CurrentContext = "live"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHelmInstallByANonDeployer pins what docs/helm.md promises about who
// installs: the admission policy is itself an object of the release, and
// Helm creates admission policies after every kind it knows (its install
// order ends with the webhooks; ValidatingAdmissionPolicy is not in it), so
// a first install by someone outside policy.deployers is not refused: the
// DaemonSet exists before the policy does. (Whoever may create a
// cluster-wide admission policy could delete one too.) From then on the
// policy is in force: the same user's helm upgrade that changes the Runner
// DaemonSet is refused with the policy's message, and a deployer's passes.
func TestHelmInstallByANonDeployer(t *testing.T) {
	bin := helm.Binary(t)
	s := startUpgradeCluster(t, requireBinaries(t), "helm-nondeployer")
	ctx := t.Context()
	kubeconfig := s.writeKubeconfig(t)
	chartDir := helm.ChartDir(t)
	admin := helm.As(kubeconfig, "alice@example.com", "system:masters")
	deployer := asDeployer(kubeconfig)
	values := helm.WriteValues(t, map[string]any{
		"clusterName": "live",
		"serverURL":   "https://compass.live.example:8443",
		"natsURL":     "tls://nats.live.example:4222",
	})
	args := func(verb string, as []string, extra ...string) []string {
		a := append([]string{verb, "compass", chartDir, "--namespace", "compass-system", "-f", values[0],
			"--set", "namespaces.createCallout=false"}, extra...)
		return append(a, as...)
	}
	if r := helm.Run(t, bin, args("install", admin, "--create-namespace")...); r.Err != nil {
		t.Fatalf("a non-deployer's first helm install: %v\n%s", r.Err, r.Stderr)
	}
	if _, err := s.cs.AppsV1().DaemonSets("compass-runner").Get(ctx, deploy.RunnerDaemonSet, metav1.GetOptions{}); err != nil {
		t.Fatalf("the Runner DaemonSet after a non-deployer's first install: %v", err)
	}
	if _, err := s.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, deploy.PolicyName, metav1.GetOptions{}); err != nil {
		t.Fatalf("the admission policy after the install: %v", err)
	}
	// The policy is in force once the API server has loaded it and its
	// binding; until then the upgrade below would pass.
	var last error
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		last = s.probePolicy(ctx)
		return last != nil, nil
	}); err != nil || !isPolicyDenial(last, msgPodOwner) {
		t.Fatalf("the installed policy never denied its probe: %v (last: %v)", err, last)
	}
	r := helm.Run(t, bin, args("upgrade", admin, "--set", "runner.priorityClassName=system-node-critical")...)
	if r.Err == nil || !strings.Contains(string(r.Stderr), msgDeployer) {
		t.Fatalf("a non-deployer's helm upgrade changing the DaemonSet: %v, want the policy's refusal\n%s", r.Err, r.Stderr)
	}
	ds, err := s.cs.AppsV1().DaemonSets("compass-runner").Get(ctx, deploy.RunnerDaemonSet, metav1.GetOptions{})
	if err != nil || ds.Spec.Template.Spec.PriorityClassName == "system-node-critical" {
		t.Fatalf("the DaemonSet after the refused upgrade: %v, priority class %q", err, ds.Spec.Template.Spec.PriorityClassName)
	}
	if r := helm.Run(t, bin, args("upgrade", deployer, "--set", "runner.priorityClassName=system-node-critical")...); r.Err != nil {
		t.Fatalf("a deployer's helm upgrade: %v\n%s", r.Err, r.Stderr)
	}
}
