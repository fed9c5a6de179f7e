//go:build nodetier

package node

// A deleted pod's token and connection (issue 34, item 3), on the real node
// through the chart: docs/self-host.md's "A deleted pod's token" done as it
// says (helm upgrade with tokenReview.enabled and tokenReview.watchPods, the
// RoleBinding command helm prints, the cluster file's tokenReview block in
// the ConfigMap), then the Runner pod deleted through the API, as a drain or
// an operator does it. Run by TestNodeHelmSQLite (the default layout).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/deploy"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
)

const (
	// podGoneBound is issue 34's bound: a deleted pod's live connection
	// ended within 2 s of the deletion.
	podGoneBound = 2 * time.Second
	// The cluster file's tokenReview block for this cluster, as
	// docs/self-host.md gives it for the cluster the chart serves.
	tokenReviewBlock = "    tokenReview:\n" +
		"      server: https://kubernetes.default.svc\n" +
		"      tokenFile: /var/run/secrets/compass/kube/token\n" +
		"      caFile: /var/run/secrets/compass/kube/ca.crt\n" +
		"      watchPods: true\n"
	// runnerSA is the Runner's ServiceAccount (DL-440).
	runnerSA = "compass-runner"
)

// podDeletion: tokenReview and the pod watch turned on through the chart
// and the cluster file; the Runner pod deleted: a live connection made with
// a copy of its token ended (kick reason pod_deleted) within podGoneBound, its token refused at once
// at both doors, its replacement (same node, same Runner ID) answering;
// then the API server made unreachable from the doors' pod: a new token is
// accepted on offline verification at both doors (onUnavailable: offline,
// the default), counted as fell_back, and how long that takes. Everything
// is undone after: the cluster file as it was, the iptables rule removed.
func (e *env) podDeletion(t *testing.T, h *helmOp, l layout, d *deployment, pg *pinger) {
	t.Helper()
	ctx := t.Context()
	cluster := map[string]string{"cluster": clusterName}

	// 1. helm upgrade with the values, the RoleBinding NOTES.txt prints.
	start := time.Now()
	took := h.upgrade("tokenReview on", "tokenReview.enabled=true", "tokenReview.watchPods=true")
	if _, err := e.kubectlRun(ctx, nil, "-n", runnerNS, "create", "rolebinding", "compass-runner-pod-watcher",
		"--clusterrole=compass-runner-pod-watcher",
		"--serviceaccount="+systemNS+":compass-callout", "--serviceaccount="+systemNS+":"+deploy.ServerName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.kubectlRun(context.Background(), nil, "-n", runnerNS, "delete", "rolebinding", "compass-runner-pod-watcher", "--ignore-not-found")
	})
	if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "rollout", "status", l.callout(), "--timeout=5m"); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	if err := waitFor(ctx, helmStepWait, "every workload ready after tokenReview.enabled", func() (bool, error) { return e.allReady(ctx, d.workloads) }); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}

	// 2. The cluster file's tokenReview block, in the operator's ConfigMap.
	cms := e.cs.CoreV1().ConfigMaps(systemNS)
	cm, err := cms.Get(ctx, deploy.RunnerClustersConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig := cm.Data["clusters.yaml"]
	cm.Data["clusters.yaml"] = orig + tokenReviewBlock
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		ctx := context.Background()
		cm, err := cms.Get(ctx, deploy.RunnerClustersConfigMap, metav1.GetOptions{})
		if err == nil && cm.Data["clusters.yaml"] != orig {
			cm.Data["clusters.yaml"] = orig
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("restoring the cluster file: %v", err)
		}
	}
	t.Cleanup(restore)
	var last error
	if err := waitFor(ctx, 3*time.Minute, "compass_pod_watch_up 1 in the callout and the Server", func() (bool, error) {
		for _, port := range []string{calloutPort, serverMetricsPort} {
			m, err := e.scrapeServerPod(ctx, port)
			if err != nil {
				last = err
				return false, nil
			}
			if v, err := m.must("compass_pod_watch_up", cluster); err != nil || v != 1 {
				last = fmt.Errorf("port %s: compass_pod_watch_up %v (%v)", port, v, err)
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("%v (last: %v)\n%s", err, last, e.logLines(ctx, systemNS, serverPod, "callout", 20, "podwatch", "tokenReview", "cluster"))
	}
	if err := waitFor(ctx, 2*time.Minute, "a pong with tokenReview on", func() (bool, error) {
		last = pg.ping(ctx, d.runnerID)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)", err, last)
	}
	t.Logf("helm: tokenReview and the pod watch on (helm upgrade %.1f s, the RoleBinding, the ConfigMap edited): watching and answering %.1f s after the upgrade began",
		took.Seconds(), time.Since(start).Seconds())

	// 3. The Runner pod deleted.
	old, err := e.runnerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldToken, err := os.ReadFile(e.tokenFile(old))
	if err != nil {
		t.Fatal(err)
	}
	runners, err := e.runnerClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := enrollWith(ctx, runners, string(oldToken)); err != nil {
		t.Fatalf("the Runner's token before its pod is deleted: %v, want enrolled", err)
	}
	kicked := func() float64 {
		m, err := e.scrapeServerPod(ctx, calloutPort)
		if err != nil {
			return -1
		}
		v, _ := m.value("compass_callout_kicks_total", map[string]string{"reason": "pod_deleted", "result": "kicked"})
		return v
	}
	kicked0 := kicked()
	if kicked0 < 0 {
		t.Fatal("scraping the callout failed")
	}
	// A copy of the token, connected from outside the pod (the Runner's
	// own connection closes as the kubelet stops it: the copy is what only
	// the pod watch ends). It displaces nothing: the pod is deleted well
	// within the duplicate grace.
	closedAt := make(chan time.Time, 1)
	cp, err := e.natsDial(ctx, string(oldToken), nats.ClosedHandler(func(*nats.Conn) { closedAt <- time.Now() }))
	if err != nil {
		t.Fatalf("a copy of the Runner's token at NATS before its pod is deleted: %v, want connected", err)
	}
	defer cp.Close()
	deleted := time.Now()
	if err := e.cs.CoreV1().Pods(runnerNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var ended time.Duration
	select {
	case at := <-closedAt:
		ended = at.Sub(deleted)
	case <-time.After(podGoneBound + 30*time.Second):
		t.Fatalf("the copied token's connection still open %s after its pod was deleted\n%s", podGoneBound+30*time.Second,
			e.logLines(ctx, systemNS, serverPod, "callout", 20, "kick", "podwatch"))
	}
	if err := waitFor(ctx, 30*time.Second, "the callout's pod_deleted kick counted", func() (bool, error) {
		return kicked() > kicked0, nil
	}); err != nil {
		t.Error(err)
	}
	if ended > podGoneBound {
		t.Errorf("the deleted pod's connection ended %s after the deletion, want within %s", ended.Round(time.Millisecond), podGoneBound)
	}
	// Its token, at both doors, straight after: the pod watch, not the
	// API server's own review (which reuses a success for 10 s).
	var ce *connect.Error
	if err := enrollWith(ctx, runners, string(oldToken)); !errors.As(err, &ce) || ce.Code() != connect.CodeUnauthenticated {
		t.Errorf("the deleted pod's token at the door: %v, want Unauthenticated", err)
	}
	doorRefused := time.Since(deleted)
	natsErr := e.natsConnect(ctx, string(oldToken))
	if natsErr == nil || !strings.Contains(strings.ToLower(natsErr.Error()), "authorization violation") {
		t.Errorf("the deleted pod's token at NATS: %v, want an authorization violation", natsErr)
	}
	natsRefused := time.Since(deleted)
	if doorRefused > 10*time.Second || natsRefused > 10*time.Second {
		t.Errorf("the deleted pod's token refused %s (door) and %s (NATS) after the deletion: the API server's 10 s reuse, not the pod watch", doorRefused, natsRefused)
	}
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
	if err := waitFor(ctx, 2*time.Minute, "the replacement's first pong", func() (bool, error) {
		last = pg.ping(ctx, d.runnerID)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)\n%v", err, last, e.podSummary(ctx))
	}
	t.Logf("helm: Runner pod deleted: a copied token's connection ended (pod_deleted) %.2f s after the deletion; its token refused at the door %.2f s and at NATS %.2f s after; the replacement %s answering %.1f s after",
		ended.Seconds(), doorRefused.Seconds(), natsRefused.Seconds(), repl.Name, time.Since(deleted).Seconds())

	// 4. The API server unreachable from the doors' pod: a token no door
	// has reviewed yet (the kubelet's TokenRequest for the replacement).
	apiIP, apiPort, err := e.apiServerEndpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	podIP, err := e.podIP(ctx, systemNS, serverPod)
	if err != nil {
		t.Fatal(err)
	}
	blocked := true
	unblock := func() {
		if !blocked {
			return
		}
		for iptables("-D", "INPUT", "-j", faultChain) == nil {
		}
		_ = iptables("-F", faultChain)
		_ = iptables("-X", faultChain)
		blocked = false
	}
	t.Cleanup(unblock)
	if err := errors.Join(
		iptables("-N", faultChain),
		iptables("-A", faultChain, "-s", podIP+"/32", "-d", apiIP+"/32", "-p", "tcp", "--dport", apiPort, "-j", "DROP"),
		iptables("-I", "INPUT", "1", "-j", faultChain),
	); err != nil {
		t.Fatalf("the API server outage's iptables rule: %v", err)
	}
	fresh, err := e.kubeletToken(ctx, repl)
	if err != nil {
		t.Fatal(err)
	}
	fellBack := func(port string) float64 {
		m, err := e.scrapeServerPod(ctx, port)
		if err != nil {
			t.Fatalf("scraping port %s: %v", port, err)
		}
		v, _ := m.value("compass_token_reviews_total", map[string]string{"cluster": clusterName, "outcome": "fell_back"})
		return v
	}
	door0, callout0 := fellBack(serverMetricsPort), fellBack(calloutPort)
	at := time.Now()
	if err := enrollWith(ctx, runners, fresh); err != nil {
		t.Errorf("a new token at the door with the API server unreachable: %v, want enrolled (onUnavailable: offline)", err)
	}
	doorTook := time.Since(at)
	at = time.Now()
	if err := e.natsConnect(ctx, fresh); err != nil {
		t.Errorf("a new token at NATS with the API server unreachable: %v, want connected (onUnavailable: offline)", err)
	}
	natsTook := time.Since(at)
	door1, callout1 := fellBack(serverMetricsPort), fellBack(calloutPort)
	if door1 <= door0 || callout1 <= callout0 {
		t.Errorf("compass_token_reviews_total{outcome=fell_back}: door %v → %v, callout %v → %v; want both counted", door0, door1, callout0, callout1)
	}
	unblock()
	if err := waitFor(ctx, 2*time.Minute, "a pong after the API server outage", func() (bool, error) {
		last = pg.ping(ctx, d.runnerID)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)", err, last)
	}
	t.Logf("helm: the API server unreachable from the doors (DROP): a new token accepted on offline verification (fell_back counted) in %.2f s at the door and %.2f s at NATS",
		doorTook.Seconds(), natsTook.Seconds())
	restore()
}

// enrollWith calls Enroll with tok.
func enrollWith(ctx context.Context, runners interface {
	Enroll(context.Context, *connect.Request[runnerv1.EnrollRequest]) (*connect.Response[runnerv1.EnrollResponse], error)
}, tok string) error {
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+tok)
	_, err := runners.Enroll(ctx, req)
	return err
}

// natsConnect connects to the release's NATS Service with a Runner token,
// as the Runner does, and closes the connection at once: nil when the
// callout authorized it.
func (e *env) natsConnect(ctx context.Context, tok string) error {
	nc, err := e.natsDial(ctx, tok)
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}

// natsDial connects to the release's NATS Service with a Runner token, with
// no reconnect.
func (e *env) natsDial(ctx context.Context, tok string, opts ...nats.Option) (*nats.Conn, error) {
	svc, err := e.cs.CoreV1().Services(systemNS).Get(ctx, natsStatefulSet, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(e.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "4222")
	return nats.Connect("tls://nats."+systemNS+".svc:4222", append([]nats.Option{
		nats.Token(tok),
		nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		nats.SetCustomDialer(fixedDialer{addr: addr}),
		nats.NoReconnect(), nats.Timeout(10 * time.Second), nats.MaxReconnects(0)}, opts...)...)
}

// fixedDialer dials addr whatever address it is asked for: the Service's
// name, for TLS, at its ClusterIP, which the host reaches.
type fixedDialer struct{ addr string }

func (f fixedDialer) Dial(network, _ string) (net.Conn, error) {
	return (&net.Dialer{Timeout: 10 * time.Second}).Dial(network, f.addr)
}

// apiServerEndpoint is the kubernetes Service's endpoint, as a pod's
// connection to https://kubernetes.default.svc reaches it.
func (e *env) apiServerEndpoint(ctx context.Context) (ip, port string, err error) {
	slices, err := e.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		return "", "", err
	}
	for _, s := range slices.Items {
		if len(s.Endpoints) > 0 && len(s.Endpoints[0].Addresses) > 0 && len(s.Ports) > 0 && s.Ports[0].Port != nil {
			return s.Endpoints[0].Addresses[0], fmt.Sprint(*s.Ports[0].Port), nil
		}
	}
	return "", "", errors.New("test/node: the kubernetes Service has no endpoint")
}

// kubeletToken is a new Runner token for pod, requested as the node's
// kubelet requests it (the only requester the admission policies allow).
func (e *env) kubeletToken(ctx context.Context, pod *corev1.Pod) (string, error) {
	secs := int64(600)
	tr, err := e.as("system:node:"+e.nodeName, "system:nodes", "system:authenticated").CoreV1().ServiceAccounts(runnerNS).CreateToken(ctx, runnerSA,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences:         []string{"compass-runner"},
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("test/node: the kubelet's TokenRequest for %s: %w", pod.Name, err)
	}
	return tr.Status.Token, nil
}
