package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/podwatch"
)

// The watcher's identity: a ServiceAccount of the daemons' namespace, and
// the Role and RoleBinding package podwatch documents.
const (
	podwatchSA   = "compass-podwatch"
	podwatchRole = "compass-podwatch"
	// podwatchLabel is what the Runner's pods carry (the DaemonSet's
	// selector) and the watcher selects; the review cluster's own pod has
	// no label and is not watched.
	podwatchLabel    = "app.kubernetes.io/name"
	podwatchSelector = podwatchLabel + "=" + runnerDS
	// maxGoneLatency is issue 34's bound: a deleted pod's connection ended
	// within 2 s of the deletion, of which the watch takes this part.
	maxGoneLatency = 2 * time.Second
	// podwatchDeletions is how many deletions the latency is measured on.
	podwatchDeletions = 20
)

// goneLog records the watcher's reports, by UID, in order.
type goneLog struct {
	mu    sync.Mutex
	list  []podwatch.Gone
	wake  chan struct{} // closed and replaced on every report
	count map[types.UID]int
}

func newGoneLog() *goneLog {
	return &goneLog{wake: make(chan struct{}), count: map[types.UID]int{}}
}

func (g *goneLog) onGone(x podwatch.Gone) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.list = append(g.list, x)
	g.count[types.UID(x.UID)]++
	close(g.wake)
	g.wake = make(chan struct{})
}

// waitFor waits up to timeout for uid's report.
func (g *goneLog) waitFor(uid types.UID, timeout time.Duration) (podwatch.Gone, bool) {
	deadline := time.After(timeout)
	for {
		g.mu.Lock()
		i := slices.IndexFunc(g.list, func(x podwatch.Gone) bool { return x.UID == string(uid) })
		wake := g.wake
		var x podwatch.Gone
		if i >= 0 {
			x = g.list[i]
		}
		g.mu.Unlock()
		if i >= 0 {
			return x, true
		}
		select {
		case <-wake:
		case <-deadline:
			return podwatch.Gone{}, false
		}
	}
}

func (g *goneLog) reports(uid types.UID) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count[uid]
}

// Issue 34 against a real kube-apiserver: a watch on the Runner pods
// reports a deleted pod within 2 s of the deletion, so the callout can end
// its NATS connection then (kick reason pod_deleted) instead of 10-20 s
// later, when TokenReview starts refusing its token.
//
// The watcher's credential is a ServiceAccount token granted get, list and
// watch on pods in the Runner's namespace only, by a Role and a RoleBinding
// in that namespace. That is the RBAC the operator creates, as package
// podwatch documents it: the chart cannot render it, since DL-440 fixes
// that the rendered manifests hold no RoleBinding in the Runner's
// namespace (deploy TestRender_NoRoleBindingInNamespace).
//
// In order: the watcher started before its RBAC exists is refused (403),
// logs an ERROR, is not Healthy, and keeps retrying; the RBAC granted, the
// watch is established. podwatchDeletions pods deleted with grace period 0
// (the pod's removal) are each reported within maxGoneLatency of the
// Delete call, the latency logged (p50, max). A pod deleted with a grace
// period (deletionTimestamp set, the object still there: no kubelet stops
// it) is reported at once, and not again when it is removed. The API
// server restarted (etcd kept): the watch fails, re-establishes itself,
// and a pod deleted as the API server comes back, and one deleted once the
// watch is back, are both reported.
func TestLivePodWatchReportsADeletedPodWithinTwoSeconds(t *testing.T) {
	c := startReviewCluster(t)
	ctx := t.Context()
	srv := c.srv

	// Pods of the Runner's label on the cluster's node.
	var pods []*corev1.Pod
	for i := range podwatchDeletions + 3 {
		p := plainPod(fmt.Sprintf("compass-runner-w%02d", i), runnerSA, runnerNode)
		p.Labels = map[string]string{podwatchLabel: runnerDS}
		created, err := srv.cs.CoreV1().Pods(runnerNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, created)
	}

	// The watcher's ServiceAccount, without its RBAC yet.
	if _, err := srv.cs.CoreV1().ServiceAccounts(reviewerNS).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: podwatchSA, Namespace: reviewerNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := saToken(ctx, srv.cs, reviewerNS, podwatchSA, srv.issuer)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "podwatch-token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}

	// The watcher, its backoff capped at 1 s (10 s by default) to keep the
	// test short.
	var logs testlog.Buffer
	g := newGoneLog()
	w, err := podwatch.New(podwatch.Config{Server: srv.url, TokenFile: tokenFile, CAFile: srv.caFile,
		Namespace: runnerNS, LabelSelector: podwatchSelector}, g.onGone,
		podwatch.WithLogger(jsonTestLogger(&logs)), podwatch.WithBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
		if t.Failed() {
			t.Logf("the watcher's log:\n%s", logs.String())
		}
	}()
	healthy := func() bool { ok, _ := w.Healthy(); return ok }

	// 1. No RBAC: refused, an ERROR naming the namespace, not Healthy,
	// retried.
	const failed = "podwatch: watching pods failed; retrying"
	logs.WaitFor(t, settleTimeout, `"msg":"`+failed+`"`, 2)
	recs, err := logs.JSONRecords(failed)
	if err != nil {
		t.Fatal(err)
	}
	wantErr := `list: the watcher may not list pods in namespace compass-runner (403 Forbidden): see the package's RBAC: ` +
		`"pods is forbidden: User \"system:serviceaccount:compass-system:compass-podwatch\" cannot list resource \"pods\" in API group \"\" in the namespace \"compass-runner\""`
	if r := recs[0]; r["level"] != "ERROR" || r["namespace"] != runnerNS || r["server"] != srv.url || r["error"] != wantErr {
		t.Errorf("the first failure logged as %v\n  want ERROR, namespace %s, error %s", r, runnerNS, wantErr)
	}
	if healthy() {
		t.Error("Healthy without the RBAC")
	}

	// 2. The RBAC, as the operator creates it: get, list, watch on pods in
	// the Runner's namespace, nothing else.
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: podwatchRole, Namespace: runnerNS},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := srv.cs.RbacV1().Roles(runnerNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: podwatchRole, Namespace: runnerNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: podwatchRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: podwatchSA, Namespace: reviewerNS}},
	}
	if _, err := srv.cs.RbacV1().RoleBindings(runnerNS).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if err := poll(ctx, func(context.Context) (bool, error) { return healthy(), nil }); err != nil {
		t.Fatalf("the watch was not established after the RBAC was granted: %v", err)
	}
	t.Logf("watch established %s after the RBAC was granted (%d failures before)",
		time.Since(granted).Round(time.Millisecond), len(mustRecords(t, &logs, failed)))
	// Nothing beyond it: not the pods of another namespace.
	as := srv.asServiceAccount("system:serviceaccount:" + reviewerNS + ":" + podwatchSA)
	if _, err := as.CoreV1().Pods(reviewerNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the watcher listing pods of %s: %v, want forbidden", reviewerNS, err)
	}

	// 3. Deletions with grace period 0, each reported within
	// maxGoneLatency of the Delete call.
	zero := int64(0)
	deleteNow := func(p *corev1.Pod) {
		t.Helper()
		if err := srv.cs.CoreV1().Pods(runnerNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	var lat []time.Duration
	for _, p := range pods[:podwatchDeletions] {
		start := time.Now()
		deleteNow(p)
		x, ok := g.waitFor(p.UID, 10*time.Second)
		if !ok {
			t.Fatalf("pod %s deleted, not reported within 10 s", p.Name)
		}
		if x.Name != p.Name || x.Node != runnerNode {
			t.Errorf("reported %+v, want pod %s on %s", x, p.Name, runnerNode)
		}
		lat = append(lat, x.At.Sub(start))
	}
	slices.Sort(lat)
	p50, worst := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("deletion (grace period 0) to onGone, from the Delete call, over %d deletions: p50 %s, max %s (min %s)",
		len(lat), p50.Round(100*time.Microsecond), worst.Round(100*time.Microsecond), lat[0].Round(100*time.Microsecond))
	if worst > maxGoneLatency {
		t.Errorf("a deletion was reported %s after the Delete call, want within %s", worst, maxGoneLatency)
	}

	// 4. A deletion with a grace period: the pod is marked (no kubelet
	// stops it, so it stays), and reported at once.
	graceful := pods[podwatchDeletions]
	thirty := int64(30)
	start := time.Now()
	if err := srv.cs.CoreV1().Pods(runnerNS).Delete(ctx, graceful.Name, metav1.DeleteOptions{GracePeriodSeconds: &thirty}); err != nil {
		t.Fatal(err)
	}
	x, ok := g.waitFor(graceful.UID, maxGoneLatency)
	if !ok {
		t.Fatalf("pod %s marked for deletion, not reported within %s", graceful.Name, maxGoneLatency)
	}
	t.Logf("deletion with a 30 s grace period to onGone: %s", x.At.Sub(start).Round(100*time.Microsecond))
	got, err := srv.cs.CoreV1().Pods(runnerNS).Get(ctx, graceful.Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp == nil {
		t.Fatalf("pod %s after a graceful delete: %v, deletionTimestamp %v; want it still there, marked", graceful.Name, err, got.DeletionTimestamp)
	}
	deleteNow(graceful) // as the kubelet removes it once stopped

	// 5. The API server restarted, etcd kept.
	stopped := time.Now()
	if err := srv.restart(ctx, c.spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %s", time.Since(stopped).Round(time.Millisecond))
	during := pods[podwatchDeletions+1]
	deleteNow(during)
	if _, ok := g.waitFor(during.UID, settleTimeout); !ok {
		t.Fatalf("pod %s deleted as the API server came back: not reported within %s", during.Name, settleTimeout)
	}
	if err := poll(ctx, func(context.Context) (bool, error) { return healthy(), nil }); err != nil {
		t.Fatalf("the watch did not re-establish itself after the restart: %v", err)
	}
	t.Logf("watch re-established %s after the API server was stopped", time.Since(stopped).Round(time.Millisecond))
	after := pods[podwatchDeletions+2]
	start = time.Now()
	deleteNow(after)
	if x, ok := g.waitFor(after.UID, maxGoneLatency); !ok {
		t.Errorf("pod %s deleted after the restart: not reported within %s", after.Name, maxGoneLatency)
	} else {
		t.Logf("deletion after the restart to onGone: %s", x.At.Sub(start).Round(100*time.Microsecond))
	}

	// Each pod reported once, the review cluster's unlabelled pod never.
	for _, p := range pods {
		if n := g.reports(p.UID); n != 1 {
			t.Errorf("pod %s reported %d times, want once", p.Name, n)
		}
	}
	if n := g.reports(c.pod.UID); n != 0 {
		t.Errorf("the unlabelled pod %s reported %d times", c.pod.Name, n)
	}
	if n := len(mustRecords(t, &logs, "podwatch: the resourceVersion expired; listing again")); n > 0 {
		t.Logf("relisted %d times (410 after the restart)", n)
	}
}

// jsonTestLogger logs JSON lines to buf.
func jsonTestLogger(buf *testlog.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func mustRecords(t *testing.T, logs *testlog.Buffer, msg string) []map[string]any {
	t.Helper()
	recs, err := logs.JSONRecords(msg)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
