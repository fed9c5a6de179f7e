//go:build nodetier

package node

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/compass-runner/identity/deploy"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
)

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

// claims are the token's payload claims the tests read; the token itself is
// never logged.
type claims struct {
	Iss string   `json:"iss"`
	Aud []string `json:"aud"`
	Sub string   `json:"sub"`
	Exp int64    `json:"exp"`
	Iat int64    `json:"iat"`
	K8s struct {
		Namespace string `json:"namespace"`
		Node      struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"node"`
		Pod struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		ServiceAccount struct {
			Name string `json:"name"`
		} `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

func decodeClaims(tok string) (claims, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return claims{}, fmt.Errorf("test/node: the token has %d parts, not 3", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return claims{}, fmt.Errorf("test/node: token payload: %w", err)
	}
	var c claims
	if err := json.Unmarshal(raw, &c); err != nil {
		return claims{}, fmt.Errorf("test/node: token payload: %w", err)
	}
	return c, nil
}

// logRecords are a container's JSON log lines; a line that is not a JSON
// object fails the test (the daemons log JSON only).
func logRecords(t *testing.T, lines []string, what string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("%s: a log line is not JSON: %.120s", what, l)
			continue
		}
		out = append(out, m)
	}
	return out
}

func hasRecord(recs []map[string]any, msg string, attrs map[string]string) bool {
	return slices.ContainsFunc(recs, func(m map[string]any) bool {
		if m["msg"] != msg {
			return false
		}
		for k, v := range attrs {
			if fmt.Sprint(m[k]) != v {
				return false
			}
		}
		return true
	})
}

// DL-440 W4's live smoke on a real node: the DaemonSet, applied as a
// deployers identity and admitted, gets its pod from the real daemon-set
// controller under the policy; the kubelet projects the token (audience
// compass-runner, 600 s, bound to the pod and the node); the Runner enrolls
// as <cluster>/<node> with it, connects to NATS through the callout, and
// answers a ping sent from the host through the Server's Service.
func TestNodeRunnerEnrollsWithTheKubeletsTokenAndAnswers(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()

	ds, err := e.cs.AppsV1().DaemonSets(runnerNS).Get(ctx, deploy.RunnerDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mf := ds.ManagedFields; len(mf) == 0 || mf[0].Manager != "compass-node-tier" {
		t.Errorf("DaemonSet managed by %v, want the server-side apply's field manager", mf)
	}
	pod, err := e.runnerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" || owner.Name != deploy.RunnerDaemonSet || owner.UID != ds.UID {
		t.Fatalf("Runner pod's controller = %+v, want DaemonSet %s (uid %s)", owner, deploy.RunnerDaemonSet, ds.UID)
	}
	if pod.Spec.NodeName != e.nodeName {
		t.Errorf("Runner pod on node %q, want %q", pod.Spec.NodeName, e.nodeName)
	}
	// The pod was created by the daemon-set controller itself: its event.
	evs, err := e.cs.CoreV1().Events(runnerNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=DaemonSet,involvedObject.name=" + deploy.RunnerDaemonSet})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
		return ev.Reason == "SuccessfulCreate" && ev.Source.Component == "daemonset-controller" && strings.Contains(ev.Message, pod.Name)
	}) {
		t.Errorf("no SuccessfulCreate event of the daemonset-controller for pod %s", pod.Name)
	}

	// The token the kubelet projected, read where the kubelet wrote it.
	tok, err := os.ReadFile(e.tokenFile(pod))
	if err != nil {
		t.Fatal(err)
	}
	c, err := decodeClaims(string(tok))
	if err != nil {
		t.Fatal(err)
	}
	node, err := e.cs.CoreV1().Nodes().Get(ctx, e.nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Iss != e.issuer || !slices.Equal(c.Aud, []string{deploy.TokenAudience}) || c.Exp-c.Iat != 600 ||
		c.Sub != "system:serviceaccount:"+runnerNS+":"+deploy.RunnerServiceAccount ||
		c.K8s.Pod.UID != string(pod.UID) || c.K8s.Node.Name != e.nodeName || c.K8s.Node.UID != string(node.UID) {
		t.Errorf("projected token claims: iss %q aud %v exp-iat %d sub %q pod uid %q node %q/%q; want %q [%s] 600 the Runner SA, pod %s, node %s/%s",
			c.Iss, c.Aud, c.Exp-c.Iat, c.Sub, c.K8s.Pod.UID, c.K8s.Node.Name, c.K8s.Node.UID, e.issuer, deploy.TokenAudience, pod.UID, e.nodeName, node.UID)
	}

	// The Runner enrolled as <cluster>/<node> and connected.
	lines, err := e.logs(ctx, runnerNS, pod.Name, "runner")
	if err != nil {
		t.Fatal(err)
	}
	recs := logRecords(t, lines, "runner")
	if !hasRecord(recs, "runner: enrolled", map[string]string{"runner_id": d.runnerID}) {
		t.Errorf("no \"runner: enrolled\" record with runner_id %s in the Runner's log", d.runnerID)
	}
	if !hasRecord(recs, "runner: NATS connected", nil) {
		t.Error("no \"runner: NATS connected\" record in the Runner's log")
	}
	ans, err := d.ping(ctx, d.runnerID)
	if err != nil {
		t.Fatal(err)
	}
	// Another node's Runner ID is not answered: the ping reached this Runner.
	if _, err := d.ping(ctx, clusterName+"/another-node"); err == nil {
		t.Error("a ping to a Runner ID no Runner has was answered")
	}
	t.Logf("ping %s: %s", d.runnerID, ans)
}

// Every container of the deployment runs with the rendered security context,
// as runc got it from containerd: the OCI spec of the running container has
// a read-only root, the pod's non-root user, no capability and a seccomp
// filter; every pod is ready (its probes pass), and kubectl logs shows each
// compass daemon's JSON log.
func TestNodePodsRunWithTheRenderedSecurityContext(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	// The compass daemons' containers (they log JSON) and every container
	// the render has, each of which must be found running and checked.
	daemons, rendered := map[string]bool{}, map[string]bool{}
	for _, w := range d.workloads {
		for _, c := range w.Spec.Template.Spec.Containers {
			rendered[c.Name] = true
			daemons[c.Name] = strings.HasPrefix(c.Image, "ghcr.io/compass-runner/")
		}
	}
	seen := map[string]bool{}
	for _, ns := range []string{runnerNS, systemNS} {
		pods, err := e.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods.Items {
			if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
				continue
			}
			if !slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			}) {
				t.Errorf("%s/%s is not ready", ns, pod.Name)
			}
			for _, cs := range pod.Status.ContainerStatuses {
				seen[cs.Name] = true
				spec, err := e.ociSpec(ctx, cs.ContainerID)
				if err != nil {
					t.Errorf("%s/%s %s: %v", ns, pod.Name, cs.Name, err)
					continue
				}
				where := fmt.Sprintf("%s/%s container %s", ns, pod.Name, cs.Name)
				if !spec.Root.Readonly {
					t.Errorf("%s: root filesystem is writable", where)
				}
				if spec.Process.User.UID != 65532 || spec.Process.User.GID != 65532 {
					t.Errorf("%s: runs as %d:%d, want 65532:65532", where, spec.Process.User.UID, spec.Process.User.GID)
				}
				if caps := spec.Process.Capabilities; caps != nil && len(caps.Bounding)+len(caps.Effective)+len(caps.Permitted) > 0 {
					t.Errorf("%s: capabilities %v", where, caps)
				}
				if !spec.Process.NoNewPrivileges {
					t.Errorf("%s: privilege escalation allowed", where)
				}
				if spec.Linux.Seccomp == nil || spec.Linux.Seccomp.DefaultAction == "" || spec.Linux.Seccomp.DefaultAction == "SCMP_ACT_ALLOW" {
					t.Errorf("%s: no RuntimeDefault seccomp filter (%+v)", where, spec.Linux.Seccomp)
				}
				if daemons[cs.Name] {
					lines, err := e.logs(ctx, ns, pod.Name, cs.Name)
					if err != nil {
						t.Fatal(err)
					}
					if recs := logRecords(t, lines, where); len(recs) == 0 {
						t.Errorf("%s: no JSON log record", where)
					}
				}
			}
		}
	}
	for c := range rendered {
		if !seen[c] {
			t.Errorf("no running container %q was checked", c)
		}
	}
}

// ociSpec is the runtime spec containerd gave runc for a container.
type ociSpecT struct {
	Root    struct{ Readonly bool } `json:"root"`
	Process struct {
		User struct {
			UID uint32 `json:"uid"`
			GID uint32 `json:"gid"`
		} `json:"user"`
		Capabilities *struct {
			Bounding, Effective, Permitted []string
		} `json:"capabilities"`
		NoNewPrivileges bool `json:"noNewPrivileges"`
	} `json:"process"`
	Linux struct {
		Seccomp *struct {
			DefaultAction string `json:"defaultAction"`
		} `json:"seccomp"`
	} `json:"linux"`
}

func (e *env) ociSpec(ctx context.Context, containerID string) (ociSpecT, error) {
	id, ok := strings.CutPrefix(containerID, "containerd://")
	if !ok {
		return ociSpecT{}, fmt.Errorf("container ID %q is not containerd's", containerID)
	}
	out, err := runCmd(ctx, e.ctr, "--address", e.containerdSock, "-n", "k8s.io", "containers", "info", "--spec", id)
	if err != nil {
		return ociSpecT{}, err
	}
	var s ociSpecT
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return ociSpecT{}, fmt.Errorf("test/node: ctr containers info: %w", err)
	}
	return s, nil
}

// DL-440 W4's threat proof with the real controllers. A DaemonSet "evil"
// naming the Runner's ServiceAccount, created before the policy by a user
// allowed to create DaemonSets (so it exists, as on a cluster where the policy
// came late), gets no pod from the real daemon-set controller once a node
// matches it: each create is refused by the policy, and the controller's
// events say so. Creating another such DaemonSet now is refused outright. A
// user bound to edit, whom RBAC allows to request tokens, cannot get one for
// the Runner's ServiceAccount.
func TestNodeThreatProofWithTheRealControllers(t *testing.T) {
	theDeployment(t)
	e := theEnv
	ctx := t.Context()

	// The evil DaemonSet was created before the apply (deployment setup):
	// now a node matches its selector.
	if _, err := e.kubectlRun(ctx, nil, "label", "node", e.nodeName, evilLabel+"=yes", "--overwrite"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.kubectlRun(context.Background(), nil, "label", "node", e.nodeName, evilLabel+"-") })
	const denial = "compass-runner pods must come from the compass-runner DaemonSet"
	if err := waitFor(ctx, time.Minute, "the daemon-set controller's FailedCreate event for evil", func() (bool, error) {
		evs, err := e.cs.CoreV1().Events(runnerNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=DaemonSet,involvedObject.name=evil"})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
			return ev.Reason == "FailedCreate" && ev.Source.Component == "daemonset-controller" && strings.Contains(ev.Message, denial)
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	pods, err := e.cs.CoreV1().Pods(runnerNS).List(ctx, metav1.ListOptions{LabelSelector: "app=evil"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Errorf("DaemonSet evil has %d pods, want none", len(pods.Items))
	}

	// Another evil DaemonSet now: refused at the API.
	ds := evilDaemonSet("evil-2")
	if _, err := e.as(dsUser).AppsV1().DaemonSets(runnerNS).Create(ctx, ds, metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "only the compass-runner DaemonSet may use the compass-runner ServiceAccount") {
		t.Errorf("creating DaemonSet evil-2 with the Runner ServiceAccount: %v, want the policy's denial", err)
	}

	// The edit user: RBAC allows the TokenRequest, the policy refuses it.
	pod, err := e.runnerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sar, err := e.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: editUser, ResourceAttributes: &authzv1.ResourceAttributes{Namespace: runnerNS, Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: deploy.RunnerServiceAccount},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !sar.Status.Allowed {
		t.Fatalf("RBAC does not allow %s to request tokens (%s): the test would not show the policy", editUser, sar.Status.Reason)
	}
	exp := int64(600)
	_, err = e.as(editUser).CoreV1().ServiceAccounts(runnerNS).CreateToken(ctx, deploy.RunnerServiceAccount, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{deploy.TokenAudience}, ExpirationSeconds: &exp,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	// Both policies refuse it (DL-440's username check, DL-456's group
	// check); which message the API server shows first is its choice.
	if err == nil || !strings.Contains(err.Error(), "only kubelets may request a compass-runner token") &&
		!strings.Contains(err.Error(), "only kubelets (group system:nodes) may request a compass-runner token") {
		t.Errorf("edit user's TokenRequest for the Runner pod: %v, want a policy's denial", err)
	}

	// DL-456 on the real node: the edit user cannot exec into the live
	// Runner pod (RBAC allows it; the policy refuses it before the kubelet
	// is asked), nor change its image.
	err = e.as(editUser).CoreV1().RESTClient().Post().Namespace(runnerNS).Resource("pods").Name(pod.Name).SubResource("exec").
		Param("command", "sh").Param("stdin", "true").Param("stdout", "true").Param("container", "runner").Do(ctx).Error()
	if err == nil || !strings.Contains(err.Error(), "exec, attach and port-forward are refused on compass-runner pods") {
		t.Errorf("edit user's exec into the Runner pod: %v, want the containment policy's denial", err)
	}
	_, err = e.as(editUser).CoreV1().Pods(runnerNS).Patch(ctx, pod.Name, types.StrategicMergePatchType,
		[]byte(`{"spec":{"containers":[{"name":"runner","image":"attacker.example/runner:evil"}]}}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "a compass-runner pod's spec cannot be changed") {
		t.Errorf("edit user's set image on the Runner pod: %v, want the containment policy's denial", err)
	}
}

const (
	evilLabel = "compass.test/evil"
	dsUser    = "mallory"   // may create DaemonSets anywhere
	editUser  = "edit-user" // bound to the edit ClusterRole
)

// evilDaemonSet is hardened as Pod Security "restricted" asks (the Runner
// namespace enforces it), as an attacker would write it: only the policy
// stands between it and the Runner's identity.
func evilDaemonSet(name string) *appsv1.DaemonSet {
	labels := map[string]string{"app": "evil"}
	no, yes, uid := false, true, int64(65532)
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:           deploy.RunnerServiceAccount,
					AutomountServiceAccountToken: &no,
					NodeSelector:                 map[string]string{evilLabel: "yes"},
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: &yes, RunAsUser: &uid,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{Name: "evil", Image: "compass.test/pause:v1", SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: &no,
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					}}},
				},
			},
		},
	}
}

// setupThreat runs before the deployment is applied: the two users and
// their bindings, and DaemonSet evil, created while no policy exists.
func (e *env) setupThreat(ctx context.Context) error {
	rbac := e.cs.RbacV1()
	_, err1 := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "compass-node-daemonsets"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "create", "update", "delete"}}},
	}, metav1.CreateOptions{})
	_, err2 := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "compass-node-mallory"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "compass-node-daemonsets"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: dsUser}},
	}, metav1.CreateOptions{})
	_, err3 := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "compass-node-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: editUser}},
	}, metav1.CreateOptions{})
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	_, err := e.as(dsUser).AppsV1().DaemonSets(runnerNS).Create(ctx, evilDaemonSet("evil"), metav1.CreateOptions{})
	return err
}

// steadyPing pings the Runner. A ping whose answer did not come within the
// door's 5 s (this tier shares two cores with the other tiers' race-detector
// runs) is tried once more at once and logged; an error of any other kind,
// or a second timeout in a row, is the Runner not answering.
func (d *deployment) steadyPing(ctx context.Context, t *testing.T) error {
	_, err := d.ping(ctx, d.runnerID)
	var ce *connect.Error
	if err == nil || !errors.As(err, &ce) || ce.Code() != connect.CodeDeadlineExceeded {
		return err
	}
	t.Logf("a ping timed out (%v); trying once more", err)
	_, err = d.ping(ctx, d.runnerID)
	return err
}

// rotation hands the Runner pod's first token to the deletion test, which
// runs after the rotation test.
var rotation struct {
	once  sync.Once
	done  chan struct{}
	first string // the Runner pod's first token (never logged)
	pod   *corev1.Pod
}

func rotationDone() chan struct{} {
	rotation.once.Do(func() { rotation.done = make(chan struct{}) })
	return rotation.done
}

// The kubelet rewrites the projected token at about 80 % of its 600 s; one
// Runner process (same container, no restart) reads both files, its next
// CONNECT uses the new token (its early reconnect), and pings are answered
// before, across and after the change.
func TestNodeRunnerKeepsAnsweringAcrossTheKubeletsRotation(t *testing.T) {
	t.Parallel()
	defer close(rotationDone())
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	pod, err := e.runnerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rotation.pod = pod
	containerID := pod.Status.ContainerStatuses[0].ContainerID
	first, err := os.ReadFile(e.tokenFile(pod))
	if err != nil {
		t.Fatal(err)
	}
	rotation.first = string(first)
	c1, err := decodeClaims(string(first))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first token: iat %s, exp %s; the kubelet rewrites it from %s",
		time.Unix(c1.Iat, 0).UTC().Format(time.TimeOnly), time.Unix(c1.Exp, 0).UTC().Format(time.TimeOnly), time.Unix(c1.Iat+480, 0).UTC().Format(time.TimeOnly))

	// Ping every 5 s until the rewrite; every ping must be answered.
	var second string
	pings := 0
	limit := time.Until(time.Unix(c1.Exp, 0)) + time.Minute
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	deadline := time.After(limit)
	for second == "" {
		select {
		case <-deadline:
			t.Fatalf("the kubelet did not rewrite the token within %s (its exp passed)", limit.Round(time.Second))
		case <-tick.C:
		}
		if err := d.steadyPing(ctx, t); err != nil {
			t.Fatalf("ping %d before the rewrite: %v", pings+1, err)
		}
		pings++
		now, err := os.ReadFile(e.tokenFile(pod))
		if err != nil {
			t.Fatal(err)
		}
		if string(now) != rotation.first {
			second = string(now)
		}
	}
	rewritten := time.Now()
	c2, err := decodeClaims(second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the kubelet rewrote the token %s after its iat (%.0f %% of 600 s); %d pings answered before", rewritten.Sub(time.Unix(c1.Iat, 0)).Round(time.Second),
		float64(rewritten.Unix()-c1.Iat)/6, pings)
	if c2.Iat <= c1.Iat || c2.Exp-c2.Iat != 600 || c2.K8s.Pod.UID != c1.K8s.Pod.UID {
		t.Errorf("second token: iat %d (first %d), exp-iat %d, pod %s (first %s)", c2.Iat, c1.Iat, c2.Exp-c2.Iat, c2.K8s.Pod.UID, c1.K8s.Pod.UID)
	}

	// The Runner's next CONNECT uses the new token: its early reconnect.
	var handover time.Time
	if err := waitFor(ctx, 3*time.Minute, "the Runner's reconnect with the rewritten token", func() (bool, error) {
		lines, err := e.logs(ctx, runnerNS, pod.Name, "runner")
		if err != nil {
			return false, err
		}
		for _, r := range logRecords(t, lines, "runner") {
			if r["msg"] != "runner: reconnected early with the current token" {
				continue
			}
			at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
			if !at.Before(rewritten.Add(-10 * time.Second)) {
				handover = at
				return true, nil
			}
		}
		if err := d.steadyPing(ctx, t); err != nil {
			return false, fmt.Errorf("ping while the Runner reconnects: %w", err)
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the Runner reconnected with the new token %s after the rewrite", handover.Sub(rewritten).Round(time.Millisecond))
	for i := range 3 {
		if err := d.steadyPing(ctx, t); err != nil {
			t.Fatalf("ping %d after the reconnect: %v", i+1, err)
		}
	}
	// One Runner process throughout: the same container, never restarted.
	now, err := e.cs.CoreV1().Pods(runnerNS).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := now.Status.ContainerStatuses[0]; cs.ContainerID != containerID || cs.RestartCount != 0 {
		t.Errorf("Runner container %s restarted %d times (was %s)", cs.ContainerID, cs.RestartCount, containerID)
	}
}

// Deleting the Runner pod: the DaemonSet's replacement (a new pod UID, the
// same node) enrolls with the same Runner ID and answers. The deleted pod's
// first token, verified offline, still enrolls until its exp plus the 60 s
// leeway, and is refused from then on: the bound docs/self-host.md states.
func TestNodeReplacementPodKeepsTheRunnerID(t *testing.T) {
	t.Parallel()
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	select {
	case <-rotationDone():
	case <-ctx.Done():
		t.Fatal("the rotation test did not finish")
	}
	if rotation.pod == nil || rotation.first == "" {
		t.Fatal("the rotation test captured no token")
	}
	old := rotation.pod
	c1, err := decodeClaims(rotation.first)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cs.CoreV1().Pods(runnerNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var repl *corev1.Pod
	if err := waitFor(ctx, 2*time.Minute, "the replacement Runner pod", func() (bool, error) {
		p, err := e.runnerPod(ctx)
		if err != nil || p.UID == old.UID {
			return false, nil
		}
		repl = p
		return true, nil
	}); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	// The old Runner drains for up to its grace period and answers for the
	// same Runner ID meanwhile: the pong that counts comes after it is gone.
	if err := waitFor(ctx, 2*time.Minute, "the old Runner pod gone", func() (bool, error) {
		_, err := e.cs.CoreV1().Pods(runnerNS).Get(ctx, old.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 2*time.Minute, "the replacement's first pong", func() (bool, error) {
		_, err := d.ping(ctx, d.runnerID)
		return err == nil, nil
	}); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	t.Logf("replacement %s answered %s after the deletion (the old pod gone first)", repl.Name, time.Since(deleted).Round(time.Millisecond))
	if repl.Spec.NodeName != e.nodeName || metav1.GetControllerOf(repl) == nil || metav1.GetControllerOf(repl).Name != deploy.RunnerDaemonSet {
		t.Errorf("replacement pod on %q owned by %+v", repl.Spec.NodeName, metav1.GetControllerOf(repl))
	}
	lines, err := e.logs(ctx, runnerNS, repl.Name, "runner")
	if err != nil {
		t.Fatal(err)
	}
	if !hasRecord(logRecords(t, lines, "replacement"), "runner: enrolled", map[string]string{"runner_id": d.runnerID}) {
		t.Errorf("the replacement did not enroll as %s", d.runnerID)
	}
	tok, err := os.ReadFile(e.tokenFile(repl))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := decodeClaims(string(tok))
	if err != nil {
		t.Fatal(err)
	}
	// The node-UID rule: both pods' tokens name the same node incarnation.
	if c2.K8s.Pod.UID == c1.K8s.Pod.UID || c2.K8s.Node.UID != c1.K8s.Node.UID || c2.K8s.Node.Name != c1.K8s.Node.Name {
		t.Errorf("replacement token: pod %s node %s/%s; old: pod %s node %s/%s", c2.K8s.Pod.UID, c2.K8s.Node.Name, c2.K8s.Node.UID, c1.K8s.Pod.UID, c1.K8s.Node.Name, c1.K8s.Node.UID)
	}

	// The deleted pod's first token at the door, on both sides of exp + 60 s.
	runners, err := e.runnerClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	enroll := func() error {
		req := connect.NewRequest(&runnerv1.EnrollRequest{})
		req.Header().Set("Authorization", "Bearer "+rotation.first)
		_, err := runners.Enroll(ctx, req)
		return err
	}
	exp := time.Unix(c1.Exp, 0)
	if time.Now().Before(exp.Add(50 * time.Second)) {
		sleepUntil(ctx, exp.Add(50*time.Second))
		if err := enroll(); err != nil {
			t.Errorf("the deleted pod's token 50 s after its exp (within the leeway): %v, want accepted", err)
		}
	}
	sleepUntil(ctx, exp.Add(62*time.Second))
	var ce *connect.Error
	if err := enroll(); !errors.As(err, &ce) || ce.Code() != connect.CodeUnauthenticated {
		t.Errorf("the deleted pod's token 62 s after its exp: %v, want Unauthenticated", err)
	}
}

// sleepUntil waits for a wall-clock instant the test is about: a token's
// expiry at the real door cannot be reached with an injected clock.
func sleepUntil(ctx context.Context, at time.Time) {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
