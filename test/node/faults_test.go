//go:build nodetier

package node

// Faults on the real node, each recovered with no human action (issue 33,
// item 3). Each test injects one fault as an incident or an operator's
// mistake would (a pod deleted through the API, a container's process
// killed, a Secret or ConfigMap edited and NATS restarted to apply it, the
// issuer's port dropped on the node), clears it the same way, and measures
// the time from the clearing to every Runner answering a ping sent through
// the Server's door: at most faultRecovery, with nothing restarted by hand.
// There is no Prometheus on the node, so for the alert of
// deploy/chart/compass/files/compass-rules.yaml that covers the fault the
// test scrapes the daemons' /metrics from the host, at the pods' addresses,
// and checks the series that alert reads: bad during the fault, good after.
//
// The tests share the one deployment and run in this file's order, which is
// before the package's other tests (go test takes the files in name order).
// Each waits for a healthy deployment first and leaves it healthy, restoring
// what it changed also when it fails. Every figure is logged on a line that
// starts with "fault:"; docs/performance.md has the table.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nkeys"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/deploy"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/runner"
)

const (
	// faultRecovery: every Runner answers within this of the fault being
	// cleared (issue 33).
	faultRecovery = 10 * time.Second
	// lockoutRecovery bounds the same after a fault that locks the Runners
	// out (every CONNECT refused or unanswered): each failed attempt widens
	// the Runner's reconnect jitter window (DL-448, the fleet's storm
	// spread), so once a lockout has lasted a few attempts the Runner's next
	// one after the clearing is up to its wait plus the widest window away,
	// then an authorization. Measured: 0.0 s when an attempt fell during the
	// restoring roll, 16.4 s when none did (docs/performance.md).
	lockoutRecovery = runner.DefaultReconnectWait + runner.DefaultMaxReconnectJitter + 5*time.Second
	// recoveryWait is how long a recovery is waited for, well past
	// faultRecovery, so that a slow one is measured rather than cut off.
	recoveryWait = 2 * time.Minute
	// jwksOutage is how long the issuer is unreachable.
	jwksOutage = 2 * time.Minute
	// The rendered NATS objects (deploy/chart/compass/templates).
	natsStatefulSet = "nats"
	natsConfigMap   = "compass-nats-config"
	natsConfigKey   = "nats.conf"
	natsSelector    = "app.kubernetes.io/name=nats"
	serverPod       = deploy.ServerName + "-0"
	// The metrics listeners (the render's COMPASS_METRICS_ADDR and the
	// Runner's health listener).
	serverMetricsPort = "9090"
	calloutPort       = "9091"
	runnerHealthPort  = "8081"
	// faultChain is the iptables chain the JWKS outage adds its rule to;
	// .ci/node.sh down removes it with the node's other chains.
	faultChain = "COMPASS-NODE-FAULT"
)

// ---- pings

// pinger pings the Runners through the door with an HTTP client of its own,
// whose idle connections are dropped after a failure: after a Server pod is
// replaced, no ping waits on a connection to the old pod.
type pinger struct {
	hc    *http.Client
	admin adminv1connect.AdminServiceClient
	token string
}

func (e *env) newPinger(ctx context.Context, d *deployment) (*pinger, error) {
	hc, err := e.doorClient(ctx)
	if err != nil {
		return nil, err
	}
	return &pinger{hc: hc, admin: adminv1connect.NewAdminServiceClient(hc, doorURL, connect.WithGRPC()), token: d.adminToken}, nil
}

// ping pings one Runner, waiting at most 6 s (the door's own wait is 5 s).
func (p *pinger) ping(ctx context.Context, runnerID string) error {
	ctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	req := connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: runnerID})
	req.Header().Set("Authorization", "Bearer "+p.token)
	res, err := p.admin.PingRunner(ctx, req)
	if err != nil {
		p.hc.CloseIdleConnections()
		return err
	}
	if ans := res.Msg.GetAnswerJson(); !strings.Contains(ans, `"ok":true`) {
		return fmt.Errorf("test/node: ping %s: answer %s", runnerID, ans)
	}
	return nil
}

// runnerIDs are the Runner IDs of the running Runner pods, one per node.
func (e *env) runnerIDs(ctx context.Context) ([]string, error) {
	pods, err := e.cs.CoreV1().Pods(runnerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=compass-runner"})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			ids = append(ids, clusterName+"/"+strings.ReplaceAll(p.Spec.NodeName, ".", "_"))
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return nil, errors.New("test/node: no running Runner pod")
	}
	return slices.Compact(ids), nil
}

// all pings every Runner; nil when every one answered.
func (p *pinger) all(ctx context.Context, e *env) error {
	ids, err := e.runnerIDs(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := p.ping(ctx, id); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	return nil
}

// recovery waits until every Runner answers and returns how long after
// cleared that was. A Runner that answers at the first ping gives the
// ping's own time.
func (p *pinger) recovery(ctx context.Context, e *env, cleared time.Time) (time.Duration, error) {
	var last error
	if err := waitFor(ctx, recoveryWait, "every Runner answering a ping after the fault was cleared", func() (bool, error) {
		last = p.all(ctx, e)
		return last == nil, nil
	}); err != nil {
		return 0, fmt.Errorf("%w (last ping: %v)", err, last)
	}
	return time.Since(cleared), nil
}

// checkRecovery asserts the recovery bound and logs the table's figure.
func checkRecovery(t *testing.T, fault string, took time.Duration, seen string) {
	t.Helper()
	checkRecoveryWithin(t, fault, took, faultRecovery, seen)
}

// checkRecoveryWithin is checkRecovery with a bound of its own.
func checkRecoveryWithin(t *testing.T, fault string, took, bound time.Duration, seen string) {
	t.Helper()
	t.Logf("fault: %s: every Runner answering %.1f s after the fault was cleared; %s", fault, took.Seconds(), seen)
	if took > bound {
		t.Errorf("%s: every Runner answered %s after the fault was cleared, want at most %s", fault, took.Round(100*time.Millisecond), bound)
	}
}

// ---- metrics, scraped from the host at the pods' addresses

type metrics map[string]*dto.MetricFamily

// scrapeClient never reuses a connection: the pod behind an address may
// have been replaced since the last scrape.
var scrapeClient = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func scrape(ctx context.Context, ip, port string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, port)+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("test/node: GET %s: %s", req.URL, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("test/node: GET %s: %w", req.URL, err)
	}
	return fams, nil
}

// value sums the samples of family name whose labels include want; ok is
// false when no sample matches.
func (m metrics) value(name string, want map[string]string) (v float64, ok bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, w := range want {
			if labels[k] != w {
				match = false
			}
		}
		if !match {
			continue
		}
		ok = true
		switch {
		case s.Gauge != nil:
			v += s.GetGauge().GetValue()
		case s.Counter != nil:
			v += s.GetCounter().GetValue()
		case s.Untyped != nil:
			v += s.GetUntyped().GetValue()
		}
	}
	return v, ok
}

// must is value for a series that has to be there.
func (m metrics) must(name string, want map[string]string) (float64, error) {
	v, ok := m.value(name, want)
	if !ok {
		return 0, fmt.Errorf("test/node: no series %s%v in the scrape", name, want)
	}
	return v, nil
}

// podIP is a running pod's address.
func (e *env) podIP(ctx context.Context, ns, name string) (string, error) {
	p, err := e.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return "", fmt.Errorf("test/node: pod %s/%s has no address (or is terminating)", ns, name)
	}
	return p.Status.PodIP, nil
}

// scrapeServerPod scrapes the Server's or the callout's listener in the
// Server's pod.
func (e *env) scrapeServerPod(ctx context.Context, port string) (metrics, error) {
	ip, err := e.podIP(ctx, systemNS, serverPod)
	if err != nil {
		return nil, err
	}
	return scrape(ctx, ip, port)
}

func (e *env) scrapeRunner(ctx context.Context) (metrics, error) {
	pod, err := e.runnerPod(ctx)
	if err != nil {
		return nil, err
	}
	return scrape(ctx, pod.Status.PodIP, runnerHealthPort)
}

// calloutGauge reads one callout series, for a wait.
func (e *env) calloutValue(ctx context.Context, name string, labels map[string]string) (float64, error) {
	m, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		return 0, err
	}
	return m.must(name, labels)
}

// ---- the deployment's state

// healthy waits until every workload is ready and every Runner answers:
// each fault starts from a healthy deployment.
func (e *env) healthy(ctx context.Context, d *deployment, p *pinger) error {
	if err := waitFor(ctx, 3*time.Minute, "every workload ready", func() (bool, error) { return e.allReady(ctx, d.workloads) }); err != nil {
		return errors.Join(err, e.podSummary(ctx))
	}
	var last error
	if err := waitFor(ctx, 2*time.Minute, "every Runner answering before the fault", func() (bool, error) {
		last = p.all(ctx, e)
		return last == nil, nil
	}); err != nil {
		return fmt.Errorf("%w (last ping: %v)", err, last)
	}
	return nil
}

// natsReady: the NATS StatefulSet runs its current revision on every replica
// and every pod is ready.
func (e *env) natsReady(ctx context.Context) (bool, error) {
	s, err := e.cs.AppsV1().StatefulSets(systemNS).Get(ctx, natsStatefulSet, metav1.GetOptions{})
	if err != nil {
		return false, nil
	}
	want := int32(1)
	if s.Spec.Replicas != nil {
		want = *s.Spec.Replicas
	}
	st := s.Status
	return st.ObservedGeneration >= s.Generation && st.ReadyReplicas == want && st.UpdatedReplicas == want &&
		st.CurrentRevision == st.UpdateRevision, nil
}

// restartNATS restarts the NATS servers as an operator applies a changed
// Secret or configuration to them (docs/self-host.md: nats-server reads its
// passwords from its environment and cannot reload an auth_callout block):
// a rolling restart, one server at a time, each in lame duck mode first.
func (e *env) restartNATS(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "rollout", "restart", "statefulset/"+natsStatefulSet); err != nil {
		return 0, err
	}
	if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "rollout", "status", "statefulset/"+natsStatefulSet, "--timeout=5m"); err != nil {
		return 0, err
	}
	if err := waitFor(ctx, time.Minute, "every NATS server ready on the new revision", func() (bool, error) { return e.natsReady(ctx) }); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// runnerNATSPod is the NATS pod the Runner's current connection is on: the
// server ID of the Runner's last connect record, found in the banner a
// nats-server logs at start ("ID: N...").
func (e *env) runnerNATSPod(ctx context.Context) (string, error) {
	pod, err := e.runnerPod(ctx)
	if err != nil {
		return "", err
	}
	lines, err := e.logs(ctx, runnerNS, pod.Name, "runner")
	if err != nil {
		return "", err
	}
	id := ""
	for _, l := range lines {
		var r map[string]any
		if json.Unmarshal([]byte(l), &r) != nil {
			continue
		}
		if r["msg"] == "runner: NATS connected" || r["msg"] == "runner: NATS reconnected" {
			if s, ok := r["server_id"].(string); ok && s != "" {
				id = s
			}
		}
	}
	if id == "" {
		return "", errors.New("test/node: no NATS connect record with a server_id in the Runner's log")
	}
	banner := regexp.MustCompile(`\bID:\s+` + regexp.QuoteMeta(id) + `\b`)
	pods, err := e.cs.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: natsSelector})
	if err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		out, err := e.kubectlRun(ctx, nil, "-n", systemNS, "logs", p.Name, "-c", "nats")
		if err != nil {
			return "", err
		}
		if banner.MatchString(out) {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("test/node: no running NATS pod logged server ID %s (the Runner's server)", id)
}

// replacePod deletes a StatefulSet's pod as an operator does (its grace
// period and hooks run) and waits until the StatefulSet's replacement, a pod
// of the same name with another UID, is ready. It returns when it was.
func (e *env) replacePod(ctx context.Context, name string) (time.Time, error) {
	old, err := e.cs.CoreV1().Pods(systemNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return time.Time{}, err
	}
	if err := e.cs.CoreV1().Pods(systemNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return time.Time{}, err
	}
	if err := waitFor(ctx, 3*time.Minute, "pod "+name+" replaced and ready", func() (bool, error) {
		p, err := e.cs.CoreV1().Pods(systemNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.UID == old.UID || p.DeletionTimestamp != nil {
			return false, nil
		}
		return podReady(p), nil
	}); err != nil {
		return time.Time{}, errors.Join(err, e.podSummary(ctx))
	}
	return time.Now(), nil
}

func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// logLines are a container's log records whose message contains one of
// subs, for a failure's message (the daemons never log a secret).
func (e *env) logLines(ctx context.Context, ns, pod, container string, n int, subs ...string) string {
	lines, err := e.logs(ctx, ns, pod, container)
	if err != nil {
		return fmt.Sprintf("(logs of %s/%s: %v)", pod, container, err)
	}
	var keep []string
	for _, l := range lines {
		for _, s := range subs {
			if strings.Contains(l, s) {
				keep = append(keep, l)
				break
			}
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return fmt.Sprintf("%s/%s log:\n  %s", pod, container, strings.Join(keep, "\n  "))
}

// ---- the faults

// A NATS server is killed: the pod the Runner's connection is on is
// deleted, and the StatefulSet recreates it. The Runner moves to another
// server at once (its CONNECT authorized by the callout); no alert reads a
// lone server's loss, and CompassRunnersLockedOut's Runner arm
// (compass_runner_nats_connected 0 with failing connects) must stay quiet.
func TestNodeFaultNATSPodKilled(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	p, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.healthy(ctx, d, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := waitFor(context.Background(), 3*time.Minute, "every NATS server ready after the test", func() (bool, error) { return e.natsReady(context.Background()) }); err != nil {
			t.Error(err)
		}
	})
	victim, err := e.runnerNATSPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, err := e.scrapeRunner(ctx)
	if err != nil {
		t.Fatal(err)
	}
	disc0, _ := before.value("compass_runner_nats_disconnects_total", nil)
	rec0, _ := before.value("compass_runner_nats_reconnects_total", map[string]string{"cause": "network"})

	deleted := time.Now()
	cleared, err := e.replacePod(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, time.Minute, "every NATS server ready", func() (bool, error) { return e.natsReady(ctx) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("NATS pod %s (the Runner's server) deleted; its replacement ready %s later", victim, cleared.Sub(deleted).Round(100*time.Millisecond))
	took, err := p.recovery(ctx, e, cleared)
	if err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}

	after, err := e.scrapeRunner(ctx)
	if err != nil {
		t.Fatal(err)
	}
	disc1, _ := after.value("compass_runner_nats_disconnects_total", nil)
	rec1, _ := after.value("compass_runner_nats_reconnects_total", map[string]string{"cause": "network"})
	conn, err := after.must("compass_runner_nats_connected", nil)
	if err != nil {
		t.Fatal(err)
	}
	if disc1 <= disc0 || rec1 <= rec0 || conn != 1 {
		t.Errorf("the Runner's metrics: disconnects_total %v -> %v, reconnects_total{network} %v -> %v, nats_connected %v; want both risen and connected 1",
			disc0, disc1, rec0, rec1, conn)
	}
	checkRecovery(t, "NATS pod killed", took, fmt.Sprintf("compass_runner_nats_disconnects_total %v -> %v, reconnects_total{network} %v -> %v, nats_connected 1 after (no alert: the Runner moved to another server)", disc0, disc1, rec0, rec1))
}

// The callout dies (its process killed, as the OOM killer or a crash ends
// it): the kubelet restarts the container. Scrapes of its listener fail
// while it is gone (up 0: CompassCalloutDown's series) and answer again
// after; its kick identity works again (compass_callout_kicks_failing 0).
func TestNodeFaultCalloutKilled(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	p, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.healthy(ctx, d, p); err != nil {
		t.Fatal(err)
	}
	pod, err := e.cs.CoreV1().Pods(systemNS).Get(ctx, serverPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cs corev1.ContainerStatus
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == "callout" {
			cs = c
		}
	}
	id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
	if !ok {
		t.Fatalf("callout container ID %q is not containerd's", cs.ContainerID)
	}
	if _, err := runCmd(ctx, e.ctr, "--address", e.containerdSock, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", id); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// Its listener is scraped at every poll until the kubelet has restarted
	// it and it is ready.
	var refused, lastRefused time.Time
	var cleared time.Time
	if err := waitFor(ctx, 2*time.Minute, "the callout container restarted by the kubelet and ready", func() (bool, error) {
		if _, err := scrape(ctx, pod.Status.PodIP, calloutPort); err != nil {
			if refused.IsZero() {
				refused = time.Now()
			}
			lastRefused = time.Now()
		}
		p, err := e.cs.CoreV1().Pods(systemNS).Get(ctx, serverPod, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == "callout" && c.RestartCount > cs.RestartCount && c.ContainerID != cs.ContainerID && c.Ready {
				cleared = time.Now()
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	if refused.IsZero() {
		t.Error("no scrape of the killed callout failed: the kill was not seen")
	} else {
		t.Logf("callout killed; scrapes failed from %s to %s after the kill; the restarted container ready %s after it",
			refused.Sub(killed).Round(10*time.Millisecond), lastRefused.Sub(killed).Round(10*time.Millisecond), cleared.Sub(killed).Round(100*time.Millisecond))
	}
	took, err := p.recovery(ctx, e, cleared)
	if err != nil {
		t.Fatal(err)
	}
	var failing float64
	if err := waitFor(ctx, time.Minute, "compass_callout_kicks_failing 0 in the restarted callout", func() (bool, error) {
		v, err := e.calloutValue(ctx, "compass_callout_kicks_failing", nil)
		failing = v
		return err == nil && v == 0, nil
	}); err != nil {
		t.Errorf("%v (last %v)", err, failing)
	}
	checkRecovery(t, "callout killed", took, fmt.Sprintf("scrapes of the callout refused for %.1f s (up 0), answered after; kicks_failing 0", lastRefused.Sub(refused).Seconds()))
}

// The Server's pod is deleted (with the callout beside it): the StatefulSet
// recreates it on its volume. The door and its NATS connection come back
// (compass_server_nats_connected 1, CompassServerNATSDisconnected's
// series); while the pod is gone neither listener answers.
func TestNodeFaultServerPodKilled(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	p, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.healthy(ctx, d, p); err != nil {
		t.Fatal(err)
	}
	// The deployment's own admin client gets fresh connections after this
	// test: its pooled ones were to the old pod.
	t.Cleanup(func() {
		if hc, err := e.doorClient(context.Background()); err == nil {
			d.admin = adminv1connect.NewAdminServiceClient(hc, doorURL, connect.WithGRPC())
		}
	})
	oldIP, err := e.podIP(ctx, systemNS, serverPod)
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	cleared, err := e.replacePod(ctx, serverPod)
	if err != nil {
		t.Fatal(err)
	}
	newIP, err := e.podIP(ctx, systemNS, serverPod)
	if err != nil {
		t.Fatal(err)
	}
	if newIP != oldIP {
		if _, err := scrape(ctx, oldIP, serverMetricsPort); err == nil {
			t.Errorf("the deleted Server pod's address %s still answers scrapes", oldIP)
		}
	}
	t.Logf("Server pod deleted; its replacement (both containers) ready %s later", cleared.Sub(deleted).Round(100*time.Millisecond))
	took, err := p.recovery(ctx, e, cleared)
	if err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	m, err := scrape(ctx, newIP, serverMetricsPort)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.must("compass_server_nats_connected", nil); err != nil || v != 1 {
		t.Errorf("compass_server_nats_connected = %v (%v), want 1", v, err)
	}
	var failing float64
	if err := waitFor(ctx, time.Minute, "compass_callout_kicks_failing 0 in the new pod's callout", func() (bool, error) {
		v, err := e.calloutValue(ctx, "compass_callout_kicks_failing", nil)
		failing = v
		return err == nil && v == 0, nil
	}); err != nil {
		t.Errorf("%v (last %v)", err, failing)
	}
	checkRecovery(t, "Server pod killed", took, "both listeners gone with the pod (up 0), compass_server_nats_connected 1 and kicks_failing 0 in the new pod")
}

// The issuer's JWKS is unreachable for jwksOutage: the node drops the Server
// pod's packets to the API server's port (the callout and the Server share
// the pod's address), as a firewall change or an API server outage would.
// Nothing fetches keys in two minutes unless asked (the refresh is hourly),
// so the operator's edit of the cluster file during the outage makes both
// daemons fetch again: the fetch fails (compass_cluster_key_fetch_failing 1)
// and the last good keys stay in force (compass_cluster_keys_usable 1: the
// series of CompassClusterKeysUnusable, which must not fire). Meanwhile a
// Runner's new CONNECT (its NATS server restarted under it) and an
// enrollment at the door are verified with those keys: no lockout at all.
// Cleared, the edit is undone and the next fetch succeeds.
func TestNodeFaultJWKSUnreachable(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	p, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.healthy(ctx, d, p); err != nil {
		t.Fatal(err)
	}
	issuer, err := url.Parse(e.issuer)
	if err != nil {
		t.Fatal(err)
	}
	issuerPort := issuer.Port()
	if issuerPort == "" {
		issuerPort = "443"
	}
	serverIP, err := e.podIP(ctx, systemNS, serverPod)
	if err != nil {
		t.Fatal(err)
	}
	cms := e.cs.CoreV1().ConfigMaps(systemNS)
	orig, err := cms.Get(ctx, deploy.RunnerClustersConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	origFile := orig.Data["clusters.yaml"]
	cluster := map[string]string{"cluster": clusterName}

	// The outage, undone also on failure.
	blocked := false
	unblock := func() error {
		if !blocked {
			return nil
		}
		// Every jump to the chain, then the chain.
		for {
			if err := iptables("-D", "INPUT", "-j", faultChain); err != nil {
				break
			}
		}
		_ = iptables("-F", faultChain)
		if err := iptables("-X", faultChain); err != nil && iptables("-S", faultChain) == nil {
			return err
		}
		blocked = false
		return nil
	}
	restoreFile := func(ctx context.Context) error {
		cm, err := cms.Get(ctx, deploy.RunnerClustersConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data["clusters.yaml"] == origFile {
			return nil
		}
		cm.Data["clusters.yaml"] = origFile
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	}
	t.Cleanup(func() {
		if err := unblock(); err != nil {
			t.Errorf("removing the outage's iptables rule: %v", err)
		}
		if err := restoreFile(context.Background()); err != nil {
			t.Errorf("restoring the cluster file: %v", err)
		}
		if err := waitFor(context.Background(), 3*time.Minute, "every NATS server ready after the test", func() (bool, error) { return e.natsReady(context.Background()) }); err != nil {
			t.Error(err)
		}
	})
	if err := errors.Join(
		iptables("-N", faultChain),
		iptables("-A", faultChain, "-s", serverIP+"/32", "-d", issuer.Hostname()+"/32", "-p", "tcp", "--dport", issuerPort, "-j", "DROP"),
		iptables("-I", "INPUT", "1", "-j", faultChain),
	); err != nil {
		blocked = true
		t.Fatalf("the outage's iptables rule: %v", err)
	}
	blocked = true
	start := time.Now()
	t.Logf("the issuer %s unreachable from the Server's pod from now for %s", e.issuer, jwksOutage)

	// Samples every Runner and both daemons' key metrics; any sample with
	// unusable keys, a keys_unavailable decision or a Runner not answering
	// is the lockout that must not happen.
	callout0, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		t.Fatal(err)
	}
	unavail0, _ := callout0.value("compass_callout_decisions_total", map[string]string{"outcome": "keys_unavailable"})
	authorized0, _ := callout0.value("compass_callout_decisions_total", map[string]string{"outcome": "authorized"})
	var samples, fetchFailing int
	sample := func() error {
		samples++
		var errs []error
		seen := 0
		for _, port := range []string{calloutPort, serverMetricsPort} {
			m, err := e.scrapeServerPod(ctx, port)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if v, err := m.must("compass_cluster_keys_usable", cluster); err != nil || v != 1 {
				errs = append(errs, fmt.Errorf("port %s: compass_cluster_keys_usable{cluster=%q} = %v (%v), want 1", port, clusterName, v, err))
			}
			if v, _ := m.value("compass_cluster_key_fetch_failing", cluster); v == 1 {
				seen++
			}
			if port == calloutPort {
				if v, _ := m.value("compass_callout_decisions_total", map[string]string{"outcome": "keys_unavailable"}); v > unavail0 {
					errs = append(errs, fmt.Errorf("the callout answered keys_unavailable %v times during the outage", v-unavail0))
				}
			}
		}
		if seen == 2 {
			fetchFailing++
		}
		return errors.Join(errs...)
	}

	// The operator edits the cluster file: both daemons read it and fetch
	// every cluster's keys again, which the outage fails.
	cm := orig.DeepCopy()
	cm.Data["clusters.yaml"] = origFile + "# edited during the issuer outage (test/node)\n"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 90*time.Second, "compass_cluster_key_fetch_failing 1 in both the callout and the Server", func() (bool, error) {
		if err := sample(); err != nil {
			return false, err
		}
		return fetchFailing > 0, nil
	}); err != nil {
		t.Fatal(errors.Join(err, errors.New(e.logLines(ctx, systemNS, serverPod, "callout", 5, "clusterfile", "key fetch"))))
	}
	t.Logf("both daemons' key fetch failed %s into the outage; their last good keys stay in force", time.Since(start).Round(100*time.Millisecond))

	// A Runner's CONNECT during the outage: its NATS server restarts under
	// it, and the callout verifies its token with the kept keys.
	victim, err := e.runnerNATSPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r0, err := e.scrapeRunner(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec0, _ := r0.value("compass_runner_nats_reconnects_total", map[string]string{"cause": "network"})
	if err := e.cs.CoreV1().Pods(systemNS).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, time.Minute, "the Runner reconnected to another NATS server during the outage", func() (bool, error) {
		m, err := e.scrapeRunner(ctx)
		if err != nil {
			return false, nil
		}
		v, _ := m.value("compass_runner_nats_reconnects_total", map[string]string{"cause": "network"})
		c, _ := m.value("compass_runner_nats_connected", nil)
		return v > rec0 && c == 1, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.all(ctx, e); err != nil {
		t.Errorf("a ping after the Runner reconnected during the outage: %v", err)
	}
	// An enrollment at the door, with the Runner's current token (read
	// where the kubelet wrote it; never logged).
	rpod, err := e.runnerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(e.tokenFile(rpod))
	if err != nil {
		t.Fatal(err)
	}
	runners, err := e.runnerClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	if _, err := runners.Enroll(ctx, req); err != nil {
		t.Errorf("enrolling with the Runner's token during the outage: %v, want accepted with the kept keys", err)
	}

	// The rest of the outage: a sample every 5 s.
	for time.Since(start) < jwksOutage {
		if err := sample(); err != nil {
			t.Errorf("%s into the outage: %v", time.Since(start).Round(time.Second), err)
		}
		if err := p.all(ctx, e); err != nil {
			t.Errorf("%s into the outage: a Runner did not answer: %v", time.Since(start).Round(time.Second), err)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(min(5*time.Second, max(0, jwksOutage-time.Since(start)))):
		}
	}
	c1, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		t.Fatal(err)
	}
	authorized1, _ := c1.value("compass_callout_decisions_total", map[string]string{"outcome": "authorized"})
	if authorized1 <= authorized0 {
		t.Errorf("the callout authorized nothing during the outage (%v -> %v): the Runner's CONNECT was not verified", authorized0, authorized1)
	}
	if err := unblock(); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	t.Logf("the issuer reachable again after %s; %d samples during the outage, %d with both fetches failing, none with unusable keys",
		cleared.Sub(start).Round(100*time.Millisecond), samples, fetchFailing)
	took, err := p.recovery(ctx, e, cleared)
	if err != nil {
		t.Fatal(err)
	}
	// The edit undone: the fetch it causes succeeds.
	if err := restoreFile(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 90*time.Second, "compass_cluster_key_fetch_failing 0 in both daemons after the outage", func() (bool, error) {
		for _, port := range []string{calloutPort, serverMetricsPort} {
			m, err := e.scrapeServerPod(ctx, port)
			if err != nil {
				return false, nil
			}
			if v, err := m.must("compass_cluster_key_fetch_failing", cluster); err != nil || v != 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Error(err)
	}
	t.Logf("key fetches succeed again %s after the issuer came back", time.Since(cleared).Round(100*time.Millisecond))
	checkRecovery(t, "JWKS unreachable 2 min", took, fmt.Sprintf("key_fetch_failing 1 in both daemons, keys_usable 1 throughout (no CompassClusterKeysUnusable), keys_unavailable decisions 0, a Runner reconnect (%v authorized) and an enrollment during it; fetch_failing 0 after", authorized1-authorized0))
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// A wrong xkey: the NATS configuration names a curve key the callout does
// not hold, and NATS is restarted onto it (the careless rotation
// CompassRunnersLockedOut is for). Every request is sealed to that key, the
// callout cannot open it (compass_callout_dropped_total{reason=
// "undecryptable"} rises: the alert's first arm), and the Runner, whose
// server went in the roll, is locked out. Restored and restarted, the Runner
// must connect again by itself. The lockout is cleared as soon as it is
// seen, which still takes the restoring roll (about 40 s); whether held or
// not (COMPASS_NODE_LOCKOUT_HOLD=2m holds it as long as an incident's), the
// Runner's reconnect backoff (2 s plus a window up to 60 s) can outlast
// faultRecovery, so the bound is lockoutRecovery (docs/performance.md,
// "Faults on the real node").
func TestNodeFaultWrongXKey(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	p, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.healthy(ctx, d, p); err != nil {
		t.Fatal(err)
	}
	cms := e.cs.CoreV1().ConfigMaps(systemNS)
	orig, err := cms.Get(ctx, natsConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := orig.Data[natsConfigKey]
	xkeyLine := regexp.MustCompile(`(?m)^([ \t]*xkey:[ \t]*)X[A-Z2-7]+[ \t]*$`)
	if n := len(xkeyLine.FindAllString(good, -1)); n != 1 {
		t.Fatalf("%s: %d xkey lines, want 1", natsConfigMap, n)
	}
	setConf := func(ctx context.Context, conf string) error {
		cm, err := cms.Get(ctx, natsConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data[natsConfigKey] = conf
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	}
	broken := false
	t.Cleanup(func() {
		if !broken {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		if err := setConf(ctx, good); err != nil {
			t.Errorf("restoring the NATS configuration: %v", err)
			return
		}
		if _, err := e.restartNATS(ctx); err != nil {
			t.Errorf("restarting NATS with the configuration restored: %v", err)
		}
	})
	other, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	otherPub, err := other.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	c0, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		t.Fatal(err)
	}
	undecryptable := map[string]string{"reason": "undecryptable"}
	drops0, _ := c0.value("compass_callout_dropped_total", undecryptable)

	if err := setConf(ctx, xkeyLine.ReplaceAllString(good, "${1}"+otherPub)); err != nil {
		t.Fatal(err)
	}
	broken = true
	took1, err := e.restartNATS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	injected := time.Now()
	t.Logf("NATS restarted onto an xkey the callout does not hold in %s", took1.Round(100*time.Millisecond))
	var drops float64
	var lastPing error
	if err := waitFor(ctx, 2*time.Minute, "the Runner locked out: not answering, and undecryptable drops at the callout", func() (bool, error) {
		v, err := e.calloutValue(ctx, "compass_callout_dropped_total", undecryptable)
		if err != nil {
			return false, nil
		}
		drops = v
		lastPing = p.all(ctx, e)
		return v > drops0 && lastPing != nil, nil
	}); err != nil {
		t.Fatal(fmt.Errorf("%w (drops %v -> %v, last ping %v)", err, drops0, drops, lastPing))
	}
	r, err := e.scrapeRunner(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := r.must("compass_runner_nats_connected", nil); err != nil || v != 0 {
		t.Errorf("during the lockout: compass_runner_nats_connected = %v (%v), want 0", v, err)
	}
	t.Logf("the Runner locked out %s after the roll; undecryptable drops %v -> %v", time.Since(injected).Round(100*time.Millisecond), drops0, drops)
	if hold := lockoutHold(t); hold > 0 {
		t.Logf("the lockout held %s more (COMPASS_NODE_LOCKOUT_HOLD)", hold)
		sleepUntil(ctx, time.Now().Add(hold))
	}

	if err := setConf(ctx, good); err != nil {
		t.Fatal(err)
	}
	took2, err := e.restartNATS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	broken = false
	cleared := time.Now()
	t.Logf("NATS restarted with the callout's xkey restored in %s", took2.Round(100*time.Millisecond))
	took, err := p.recovery(ctx, e, cleared)
	if err != nil {
		t.Fatal(errors.Join(err, errors.New(e.logLines(ctx, runnerNS, mustRunnerPodName(ctx, e), "runner", 10, "NATS", "authoriz", "slow"))))
	}
	// The alert's series stops rising: no undecryptable drop after the
	// Runner is back.
	c1, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := c1.value("compass_callout_dropped_total", undecryptable)
	time.Sleep(5 * time.Second)
	c2, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := c2.value("compass_callout_dropped_total", undecryptable)
	if d2 != d1 {
		t.Errorf("undecryptable drops still rising after the recovery: %v -> %v", d1, d2)
	}
	checkRecoveryWithin(t, "wrong xkey", took, lockoutRecovery, fmt.Sprintf("compass_callout_dropped_total{reason=\"undecryptable\"} %v -> %v during (CompassRunnersLockedOut), flat after; compass_runner_nats_connected 0 during, 1 after", drops0, d2))
}

// The kick identity's password is broken on the NATS side: compass-nats-users'
// kick-password holds the hash of another password, and NATS is restarted to
// apply it (nats-server reads it from its environment). The callout's kick
// connection is refused (compass_callout_nats_connect_failures_total
// {connection="kick",cause="authorization_refused"} rises:
// CompassNATSCredentialsRefused's series) and every sweep fails
// (compass_callout_kicks_failing 1: CompassKicksFailing's). Restored, and
// NATS restarted again, the callout's kick connection must come back by
// itself (compass_callout_nats_connected{connection="kick"} 1, kicks_failing
// 0) and the refusals stop.
func TestNodeFaultKickPasswordBroken(t *testing.T) {
	d := theDeployment(t)
	e := theEnv
	ctx := t.Context()
	p, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.healthy(ctx, d, p); err != nil {
		t.Fatal(err)
	}
	secrets := e.cs.CoreV1().Secrets(systemNS)
	orig, err := secrets.Get(ctx, deploy.NATSUsersSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := slices.Clone(orig.Data["kick-password"])
	if len(good) == 0 {
		t.Fatalf("Secret %s has no kick-password", deploy.NATSUsersSecret)
	}
	setHash := func(ctx context.Context, h []byte) error {
		s, err := secrets.Get(ctx, deploy.NATSUsersSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Data["kick-password"] = h
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		return err
	}
	broken := false
	t.Cleanup(func() {
		if !broken {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		if err := setHash(ctx, good); err != nil {
			t.Errorf("restoring the kick identity's hash: %v", err)
			return
		}
		if _, err := e.restartNATS(ctx); err != nil {
			t.Errorf("restarting NATS with the kick identity's hash restored: %v", err)
		}
	})
	if err := waitFor(ctx, time.Minute, "compass_callout_kicks_failing 0 before the fault", func() (bool, error) {
		v, err := e.calloutValue(ctx, "compass_callout_kicks_failing", nil)
		return err == nil && v == 0, nil
	}); err != nil {
		t.Fatal(err)
	}

	kickRefused := map[string]string{"connection": "kick", "cause": "authorization_refused"}
	kickConn := map[string]string{"connection": "kick"}
	refused0, err := e.calloutValue(ctx, "compass_callout_nats_connect_failures_total", kickRefused)
	if err != nil {
		t.Fatal(err)
	}

	// Another password's hash, as a careless rotation leaves it.
	other := make([]byte, 32)
	if _, err := rand.Read(other); err != nil {
		t.Fatal(err)
	}
	wrong, err := deploy.NATSPasswordHash(fmt.Sprintf("%x", other))
	if err != nil {
		t.Fatal(err)
	}
	if err := setHash(ctx, []byte(wrong+"\n")); err != nil {
		t.Fatal(err)
	}
	broken = true
	took1, err := e.restartNATS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	injected := time.Now()
	t.Logf("NATS restarted with another password's hash for compass-kick in %s", took1.Round(100*time.Millisecond))
	// The fault is held until the callout has seen it as the alerts read
	// it: sweeps failing, and the kick connection refused more than once
	// (CompassNATSCredentialsRefused's threshold), while it is down.
	var failing, refused1, kickUp float64
	if err := waitFor(ctx, 2*time.Minute, "compass_callout_kicks_failing 1 and the kick connection refused twice", func() (bool, error) {
		c, err := e.scrapeServerPod(ctx, calloutPort)
		if err != nil {
			return false, nil
		}
		failing, _ = c.value("compass_callout_kicks_failing", nil)
		refused1, _ = c.value("compass_callout_nats_connect_failures_total", kickRefused)
		kickUp, _ = c.value("compass_callout_nats_connected", kickConn)
		return failing == 1 && refused1-refused0 >= 2 && kickUp == 0, nil
	}); err != nil {
		t.Error(fmt.Errorf("%w (kicks_failing %v, kick refusals %v -> %v, kick connected %v)\n%s", err, failing, refused0, refused1, kickUp,
			e.logLines(ctx, systemNS, serverPod, "callout", 10, "kick")))
	} else {
		t.Logf("kicks_failing 1 and the kick connection refused %v times %s after NATS was restarted", refused1-refused0, time.Since(injected).Round(100*time.Millisecond))
	}

	if err := setHash(ctx, good); err != nil {
		t.Fatal(err)
	}
	took2, err := e.restartNATS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	broken = false
	cleared := time.Now()
	t.Logf("NATS restarted with the kick identity's hash restored in %s", took2.Round(100*time.Millisecond))
	took, err := p.recovery(ctx, e, cleared)
	if err != nil {
		t.Fatal(err)
	}
	var kicksBack time.Duration
	if err := waitFor(ctx, 2*time.Minute, "compass_callout_kicks_failing 0 (the kick identity connected again)", func() (bool, error) {
		v, err := e.calloutValue(ctx, "compass_callout_kicks_failing", nil)
		return err == nil && v == 0, nil
	}); err != nil {
		t.Error(errors.Join(err, errors.New(e.logLines(ctx, systemNS, serverPod, "callout", 15, "kick", "NATS"))))
	} else {
		kicksBack = time.Since(cleared)
		t.Logf("compass_callout_kicks_failing 0 %s after the fault was cleared", kicksBack.Round(100*time.Millisecond))
	}
	// The refusals stop: no new one over 10 s (the kick connection's
	// retries come at least every 9 s while it is refused).
	c2, err := e.scrapeServerPod(ctx, calloutPort)
	if err != nil {
		t.Fatal(err)
	}
	refused2, _ := c2.value("compass_callout_nats_connect_failures_total", kickRefused)
	if v, err := c2.must("compass_callout_nats_connected", kickConn); err != nil || v != 1 {
		t.Errorf("after the fault: compass_callout_nats_connected%v = %v (%v), want 1", kickConn, v, err)
	}
	time.Sleep(10 * time.Second)
	if v, _ := e.calloutValue(ctx, "compass_callout_nats_connect_failures_total", kickRefused); v != refused2 {
		t.Errorf("the kick identity still refused after the fault was cleared: %v -> %v", refused2, v)
	}
	checkRecovery(t, "kick password broken", took, fmt.Sprintf("kick connect_failures_total{authorization_refused} %v -> %v and kicks_failing 1 during (CompassNATSCredentialsRefused, CompassKicksFailing); kick connected 1 and kicks_failing 0 %.1f s after clearing",
		refused0, refused2, kicksBack.Seconds()))
}

// lockoutHold is how long the wrong-xkey test keeps the Runners locked out
// once it has seen the lockout: none by default, which keeps the tier short
// but clears the fault while the Runner's reconnect backoff is still small.
// COMPASS_NODE_LOCKOUT_HOLD (a Go duration; 2m is about when
// CompassRunnersLockedOut fires) measures the recovery from a lockout as
// long as a real incident's, after the backoff has grown.
func lockoutHold(t *testing.T) time.Duration {
	v := os.Getenv("COMPASS_NODE_LOCKOUT_HOLD")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		t.Fatalf("COMPASS_NODE_LOCKOUT_HOLD=%q is not a duration", v)
	}
	return d
}

func mustRunnerPodName(ctx context.Context, e *env) string {
	p, err := e.runnerPod(ctx)
	if err != nil {
		return "compass-runner"
	}
	return p.Name
}
