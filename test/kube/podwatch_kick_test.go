package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/test/natsembed"
)

// podKickBound is issue 34's bound: a deleted pod's live NATS connection is
// ended within 2 s of the deletion.
const podKickBound = 2 * time.Second

// grantPodWatch gives the review cluster's reviewer what a pod watch needs
// besides TokenReview: get, list and watch on pods in the Runner's
// namespace only (a Role and RoleBinding there, which the operator makes:
// DL-440 fixes that the rendered manifests have none in that namespace;
// docs/self-host.md, "A deleted pod's token").
func (c *reviewCluster) grantPodWatch(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "compass-pod-watch", Namespace: runnerNS},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := c.srv.cs.RbacV1().Roles(runnerNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "compass-pod-watch", Namespace: runnerNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: reviewerSA, Namespace: reviewerNS}},
	}
	if _, err := c.srv.cs.RbacV1().RoleBindings(runnerNS).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Issue 34, item 2's watch, against a real kube-apiserver and compass-callout
// (callout.Serve with its kicker) on an in-process nats-server: the cluster's
// tokenReview has watchPods. Each of several Runner pods connects with its
// token; its pod deleted, its live connection is ended within 2 s (kick
// reason pod_deleted) and its token refused at CONNECT at once. The
// replacement pod on the same node, the same Runner ID, connects and is not
// ended by the sweeps that the other deletions cause.
func TestLiveDeletedPodsConnectionIsEndedWithinTwoSeconds(t *testing.T) {
	c := startReviewCluster(t)
	ctx := t.Context()
	if err := c.srv.waitAnonymousDiscovery(ctx); err != nil {
		t.Fatal(err)
	}
	c.grantPodWatch(t)
	dir := t.TempDir()
	clusterFile := filepath.Join(dir, "clusters.yaml")
	body := clusterFileFor("review", c.srv.issuer, "", c.srv.caFile) + fmt.Sprintf(
		"    tokenReview:\n      server: %q\n      tokenFile: %q\n      caFile: %q\n      watchPods: true\n",
		c.cfg.Server, c.cfg.TokenFile, c.cfg.CAFile)
	if err := os.WriteFile(clusterFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := natsembed.ServeForProcess(t, dir)
	cfg := ns.ServeConfig()
	logs := &testlog.Buffer{}
	cfg.RunnerClusters, cfg.MetricsAddr, cfg.Connections = clusterFile, "127.0.0.1:0", 1
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- callout.Serve(serveCtx, cfg) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("callout.Serve: %v", err)
		}
		if t.Failed() {
			t.Logf("callout log:\n%s", logs.String())
		}
	})

	newPod := func(name string) string {
		t.Helper()
		p, err := c.srv.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod(name, runnerSA, runnerNode), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := tokenFor(ctx, c.srv.cs, runnerSA, p, runnerAudience)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	type conn struct {
		nc     *nats.Conn
		closed chan time.Time
	}
	dial := func(tok string) (*conn, error) {
		cn := &conn{closed: make(chan time.Time, 1)}
		nc, err := nats.Connect(ns.URL, nats.Token(tok), nats.NoReconnect(), nats.Timeout(natsWait),
			nats.ClosedHandler(func(*nats.Conn) { cn.closed <- time.Now() }))
		if err != nil {
			return nil, err
		}
		cn.nc = nc
		t.Cleanup(nc.Close)
		return cn, nil
	}
	// The callout's first connect waits for it to be up.
	firstTok := newPod("compass-runner-kick-0")
	var first *conn
	var last error
	if err := poll(ctx, func(context.Context) (bool, error) {
		first, last = dial(firstTok)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("the callout never authorized a Runner: %v (last: %v)", err, last)
	}
	zero := int64(0)
	var took []time.Duration
	cur, curTok, curName := first, firstTok, "compass-runner-kick-0"
	for i := 1; i <= 8; i++ {
		// The replacement first: it is up when its predecessor goes, as a
		// DaemonSet's next pod would be right after.
		nextName := fmt.Sprintf("compass-runner-kick-%d", i)
		nextTok := newPod(nextName)
		deleted := time.Now()
		if err := c.srv.cs.CoreV1().Pods(runnerNS).Delete(ctx, curName, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-cur.closed:
			took = append(took, at.Sub(deleted))
		case <-time.After(podKickBound):
			t.Fatalf("deletion %d: the deleted pod's connection still open %s after the deletion", i, podKickBound)
		}
		if _, err := dial(curTok); !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("deletion %d: CONNECT with the deleted pod's token: %v, want refused", i, err)
		}
		next, err := dial(nextTok)
		if err != nil {
			t.Fatalf("deletion %d: the replacement pod's CONNECT: %v", i, err)
		}
		if i > 1 {
			// The previous replacement survived this deletion's sweep.
			select {
			case <-next.closed:
				t.Fatalf("deletion %d: the replacement's fresh connection ended", i)
			default:
			}
		}
		cur, curTok, curName = next, nextTok, nextName
	}
	if !strings.Contains(logs.String(), `"pod_deleted"`) {
		t.Fatalf("no kick with reason pod_deleted in the callout's log")
	}
	slices.Sort(took)
	t.Logf("a deleted pod's live connection ended %s (p50) to %s (max) after the deletion, over %d deletions",
		took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took))
}
