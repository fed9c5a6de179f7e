package kube

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/compass-runner/identity/deploy"
)

// jobControllerUser is the Job controller's username with
// --use-service-account-credentials, which envtest's bootstrap RBAC binds.
const jobControllerUser = "system:serviceaccount:kube-system:job-controller"

// TestFirstInstallAppliesTheManifestsBeforeTheMigrateJob: on a first install
// on PostgreSQL the migrate Job's pod runs as ServiceAccount compass-server,
// which the manifests create. Applied first, the Job is accepted but the pod
// the Job controller makes for it is refused (the ServiceAccount admission
// plugin finds no such ServiceAccount), so a wait for the Job before the
// manifests would never end; once the manifests are applied the same pod is
// admitted. docs/self-host.md gives the order accordingly. There is no Job
// controller here: the test creates the pod from the Job's template as that
// controller would, as a server-side dry run.
func TestFirstInstallAppliesTheManifestsBeforeTheMigrateJob(t *testing.T) {
	s := startUpgradeCluster(t, requireBinaries(t), "first-install")
	ctx := t.Context()
	flags := manifestFlags(nextImages, []string{"--server-database-secret", "compass-server-database", "--database-cidr", "10.20.0.0/16"})
	next := buildServer(t, t.TempDir())
	objs := renderWith(t, next, flags...)
	job := renderWith(t, next, append(flags, "--migrate-job")...)[0]

	// The guide creates the namespace first, for the Secrets.
	if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: job.GetNamespace()}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stored, err := s.apply(ctx, job, upgradeManager, false, false)
	if err != nil {
		t.Fatalf("the migrate Job before the manifests: %v", err)
	}
	if err := s.createJobPod(t, stored); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `serviceaccount "`+deploy.ServerName+`" not found`) {
		t.Fatalf("the Job's pod before the manifests: %v, want refused for the missing ServiceAccount %s", err, deploy.ServerName)
	}
	for _, u := range objs {
		if _, err := s.apply(ctx, u, upgradeManager, false, false); err != nil {
			t.Fatalf("the manifests: %v", err)
		}
	}
	if err := s.createJobPod(t, stored); err != nil {
		t.Fatalf("the Job's pod once the manifests are applied: %v", err)
	}
}

// createJobPod creates, as a dry run and as the Job controller, the pod it
// makes for job: the template, the labels the API server put on it, and the
// Job as its controller.
func (c *upgradeCluster) createJobPod(t *testing.T, job *unstructured.Unstructured) error {
	t.Helper()
	tmpl, _, err := unstructured.NestedMap(job.Object, "spec", "template")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var pt corev1.PodTemplateSpec
	if err := json.Unmarshal(raw, &pt); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    job.GetName() + "-",
			Namespace:       job.GetNamespace(),
			Labels:          pt.Labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef("batch/v1", "Job", job.GetName(), job.GetUID())},
		},
		Spec: pt.Spec,
	}
	_, err = c.asServiceAccount(jobControllerUser).CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}
