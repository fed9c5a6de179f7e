//go:build nodetier

package node

// The operator's path through the chart (docs/helm.md, docs/self-host.md),
// on the real node with the real helm and the real controllers: install as a
// deployer, first pong, a node denied by editing the cluster file's
// ConfigMap, the callout's xkey and issuer rotated by helm upgrade while the NATS
// StatefulSet rolls its three pods, an upgrade to a changed value after each
// procedure, a non-deployer's upgrade refused, a backup, helm uninstall and
// a reinstall that keeps the data. In three configurations: the chart's
// default layout (the Server on SQLite with the callout in its pod) and the
// Server on PostgreSQL with the callout's own Deployment, both with NATS in
// server-config mode, and the default layout with NATS in operator mode as
// deploy/nats/README.md's recipe makes it, whose rotation also replaces the
// Runners' account's signing key and gives NATS the new account JWTs.
//
// .ci/node.sh runs these tests on a node of their own, after the package's
// other tests have run on theirs (-run '^TestNodeHelm'): both install into
// compass-system and compass-runner. The three NATS pods share the one node:
// the chart's spreading of them is a preferred anti-affinity, which a single
// node cannot meet and the scheduler then ignores; nothing is relaxed.
//
// Every figure is logged on a line that starts with "helm:";
// docs/performance.md has the table.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/test/helm"
	"github.com/compass-runner/identity/test/natsembed"
)

const (
	release = "compass"
	// msgDeployer is the admission policy's refusal of anyone but a
	// deployer (DL-440).
	msgDeployer = "only a deployer may create or change the compass-runner DaemonSet"
	// nonDeployer is a cluster administrator who is not in policy.deployers.
	nonDeployer = "alice@example.com"
	// helmStepWait bounds each wait of the procedures: far above what each
	// takes, so a slow step is measured and a stuck one named.
	helmStepWait = 5 * time.Minute
)

// helmOp runs the pinned helm binary against the node, as the deployer or
// as someone else.
type helmOp struct {
	t      *testing.T
	bin    string
	chart  string
	values string
}

func newHelmOp(t *testing.T, values map[string]any) *helmOp {
	t.Helper()
	return &helmOp{t: t, bin: helm.Binary(t), chart: helm.ChartDir(t), values: helm.WriteValues(t, values)[0]}
}

// as are helm's flags to act as user through the node's admin kubeconfig
// (system:masters, which may impersonate).
func as(user string, groups ...string) []string {
	return helm.As(os.Getenv("KUBECONFIG"), user, groups...)
}

// asDeployer: the Flux kustomize-controller, DL-440's default deployer
// (bound to cluster-admin by prepare).
func asDeployer() []string {
	return as(deployer, "system:serviceaccounts", "system:serviceaccounts:flux-system")
}

// run runs helm and fails the test on an error; it returns how long helm
// took.
func (h *helmOp) run(what string, args ...string) time.Duration {
	h.t.Helper()
	start := time.Now()
	r := helm.Run(h.t, h.bin, args...)
	if r.Err != nil {
		h.t.Fatalf("%s: helm %s: %v\n%s", what, args[0], r.Err, r.Stderr)
	}
	return time.Since(start)
}

// install is docs/helm.md's install: the release in the callout namespace,
// which the operator made (its Secrets are in it) and keeps out of the
// release.
func (h *helmOp) install(who []string) time.Duration {
	h.t.Helper()
	return h.run("install", append([]string{"install", release, h.chart, "--namespace", systemNS, "--create-namespace", "-f", h.values}, who...)...)
}

// upgrade is docs/self-host.md's helm upgrade --reuse-values with sets.
func (h *helmOp) upgrade(what string, sets ...string) time.Duration {
	h.t.Helper()
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return h.upgradeArgs(what, args...)
}

// upgradeArgs is helm upgrade --reuse-values with args (--set-file, say).
func (h *helmOp) upgradeArgs(what string, args ...string) time.Duration {
	h.t.Helper()
	args = append([]string{"upgrade", release, h.chart, "--namespace", systemNS, "--reuse-values"}, args...)
	return h.run(what, append(args, asDeployer()...)...)
}

// changedValue is an upgrade to a changed value after a procedure: an
// annotation on every object the chart renders, so any field another
// manager took from the release would meet this apply. The DaemonSet must
// carry it after.
func (h *helmOp) changedValue(ctx context.Context, e *env, after string) {
	h.t.Helper()
	took := h.upgrade("an upgrade to a changed value after "+after, "commonAnnotations.compass\\.test/after="+after)
	ds, err := e.cs.AppsV1().DaemonSets(runnerNS).Get(ctx, deploy.RunnerDaemonSet, metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("the Runner DaemonSet after the upgrade after %s: %v", after, err)
	}
	if got := ds.Annotations["compass.test/after"]; got != after {
		h.t.Fatalf("the Runner DaemonSet's annotation after the upgrade after %s = %q, want %q", after, got, after)
	}
	h.t.Logf("helm: upgrade to a changed value after %s: %.1f s, no conflict", after, took.Seconds())
}

// pingLog pings the Runner every second until stopped and keeps what each
// ping got.
type pingLog struct {
	mu    sync.Mutex
	pings []pingResult
	stop  context.CancelFunc
	done  chan struct{}
}

type pingResult struct {
	at  time.Time
	err error
}

func startPingLog(ctx context.Context, p *pinger, runnerID string) *pingLog {
	ctx, cancel := context.WithCancel(ctx)
	l := &pingLog{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			at := time.Now()
			err := p.ping(ctx, runnerID)
			if ctx.Err() != nil {
				return
			}
			l.mu.Lock()
			l.pings = append(l.pings, pingResult{at: at, err: err})
			l.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

func (l *pingLog) finish() []pingResult {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pings
}

// outage is a run of unanswered pings: from the first to the first answered
// one after it (or the end of the log).
type outage struct {
	from, to time.Time
	last     error
}

func outages(pings []pingResult) []outage {
	var out []outage
	var cur *outage
	for _, p := range pings {
		switch {
		case p.err != nil && cur == nil:
			cur = &outage{from: p.at, to: p.at, last: p.err}
		case p.err != nil:
			cur.to, cur.last = p.at, p.err
		case cur != nil:
			cur.to = p.at
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// window is a span of the procedure in which the Server's pod restarts: on
// SQLite the door is that pod, so no ping is answered while it does.
type window struct {
	what     string
	from, to time.Time
}

func (w window) covers(o outage) bool { return !o.from.Before(w.from) && !o.to.After(w.to) }

// layout is where the Server keeps its data, which decides what runs the
// callout and what a procedure restarts.
type layout struct {
	name string
	// postgres: the Server a Deployment of two on PostgreSQL, the callout a
	// Deployment of two with the read-only role; else the Server a
	// StatefulSet of one on SQLite with the callout in its pod.
	postgres bool
	db       *nodePostgres // postgres only
	// operator: NATS in operator mode, with the recipe's keys and users
	// (deploy/nats/README.md); else server-config mode.
	operator bool
	nats     *natsOperator // operator only
}

// server is the Server's workload, as kubectl names it.
func (l layout) server() string {
	if l.postgres {
		return "deployment/" + deploy.ServerName
	}
	return "statefulset/" + deploy.ServerName
}

// callout is the workload a change of the callout's values rolls.
func (l layout) callout() string {
	if l.postgres {
		return "deployment/compass-callout"
	}
	return l.server()
}

// helmOnce: each TestNodeHelm test installs into the namespaces and
// cluster-scoped names the others use, so each needs a node of its own.
var helmOnce sync.Mutex

func TestNodeHelmSQLite(t *testing.T) { operatorPath(t, layout{name: "sqlite"}) }

func TestNodeHelmPostgres(t *testing.T) { operatorPath(t, layout{name: "postgres", postgres: true}) }

// TestNodeHelmOperator is the chart's default layout (the Server on SQLite,
// the callout in its pod) with NATS in operator mode, made as
// deploy/nats/README.md's recipe makes it: an operator requiring signing
// keys, the users signed by keys a rotation keeps, the callout's keys
// rotated by helm upgrade with the new resolver.
func TestNodeHelmOperator(t *testing.T) {
	operatorPath(t, layout{name: "operator", operator: true, nats: newNATSOperator(t)})
}

// operatorPath runs the procedures in the layout.
func operatorPath(t *testing.T, l layout) {
	if !helmOnce.TryLock() {
		t.Fatal("test/node: the TestNodeHelm tests each need a node of their own: .ci/node.sh test runs each in a phase of its own (-run '^TestNodeHelmSQLite$', ...)")
	}
	e := theEnv
	ctx := t.Context()
	k, err := e.prepare(ctx, false, l.nats)
	if err != nil {
		t.Fatal(err)
	}
	p := e.params(k)
	p.CABundle = string(k.caPEM)
	if l.postgres {
		if l.db, err = e.startPostgres(t); err != nil {
			t.Fatal(err)
		}
		if err := l.db.secrets(ctx, e); err != nil {
			t.Fatal(err)
		}
		p.ServerDatabaseSecret, p.CalloutDatabaseSecret = serverDBSecret, calloutDBSecret
		p.DatabaseCIDR, p.DatabasePort = e.nodeIP+"/32", l.db.port
	}
	values := p.Values()
	values["namespaces"].(map[string]any)["createCallout"] = false
	if l.operator {
		for key, v := range l.nats.values(t, l.nats.recipe.Resolver(t, l.nats.keys.XKey, l.nats.keys)) {
			maps.Copy(values[key].(map[string]any), v.(map[string]any))
		}
	}
	h := newHelmOp(t, values)
	d := &deployment{runnerID: clusterName + "/" + strings.ReplaceAll(e.nodeName, ".", "_")}

	// ---- install as a deployer, and the first pong
	start := time.Now()
	took := h.install(asDeployer())
	if err := e.labelRestricted(ctx); err != nil {
		t.Fatal(err)
	}
	if d.workloads, err = e.releaseWorkloads(h); err != nil {
		t.Fatal(err)
	}
	migrated := time.Duration(0)
	if l.postgres {
		// docs/helm.md: on PostgreSQL the first install is the release, then
		// the migrate Job rendered apart; the Servers wait in Init until it
		// has migrated the empty database.
		m := time.Now()
		e.migrateJob(t, h)
		if err := l.db.psql(ctx, "compass", l.db.afterMigrate...); err != nil {
			t.Fatal(err)
		}
		migrated = time.Since(m)
	}
	if err := waitFor(ctx, helmStepWait, "every workload of the release ready", func() (bool, error) { return e.allReady(ctx, d.workloads) }); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	ready := time.Since(start)
	tok, err := e.kubectlRun(ctx, nil, "-n", systemNS, "exec", l.server(), "-c", "server", "--", "compass-server", "mint-account-token", "--name", "node-tier-helm", "--ttl", "2h")
	if err != nil {
		t.Fatal(err)
	}
	d.adminToken = strings.TrimSpace(tok)
	pg, err := e.newPinger(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	var last error
	if err := waitFor(ctx, 2*time.Minute, "the first pong after helm install", func() (bool, error) {
		last = pg.ping(ctx, d.runnerID)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)\n%v", err, last, e.podSummary(ctx))
	}
	t.Logf("helm: %s: install as a deployer: helm %.1f s, the migrate Job %.1f s, every pod ready %.1f s, first pong %.1f s after the install began",
		l.name, took.Seconds(), migrated.Seconds(), ready.Seconds(), time.Since(start).Seconds())
	h.changedValue(ctx, e, "install")

	// ---- deny the node by editing the cluster file's ConfigMap (the
	// operator's object: the chart only reads it), then undo the edit
	e.denyAndAllow(t, pg, d.runnerID)
	h.changedValue(ctx, e, "deny")

	// ---- the callout's xkey and issuer rotated by helm upgrade while NATS rolls
	e.rotateKeysByHelm(t, h, l, k, pg, d.runnerID)
	h.changedValue(ctx, e, "rotation")

	// ---- a deleted pod's token and connection (tokenReview, the pod
	// watch), in the default layout
	if l.name == "sqlite" {
		e.podDeletion(t, h, l, d, pg)
		h.changedValue(ctx, e, "pod-deletion")
	}

	// ---- a non-deployer's upgrade that changes the DaemonSet is refused
	e.nonDeployerRefused(t, h)

	// ---- backup, helm uninstall, reinstall: the data is kept
	e.backupUninstallReinstall(t, h, l, d, pg)
	h.changedValue(ctx, e, "reinstall")
}

// labelRestricted is docs/helm.md's label on the callout namespace, which
// the operator made and keeps out of the release.
func (e *env) labelRestricted(ctx context.Context) error {
	_, err := e.kubectlRun(ctx, nil, "label", "--overwrite", "namespace", systemNS, "pod-security.kubernetes.io/enforce=restricted")
	return err
}

// releaseWorkloads are the workloads of the installed release, read from
// what helm stored (helm get manifest), not from a render of the test's own.
func (e *env) releaseWorkloads(h *helmOp) ([]workload, error) {
	r := helm.Run(h.t, h.bin, append([]string{"get", "manifest", release, "--namespace", systemNS}, asDeployer()...)...)
	if r.Err != nil {
		return nil, fmt.Errorf("test/node: helm get manifest: %w\n%s", r.Err, r.Stderr)
	}
	ws, err := renderedWorkloads(r.Stdout)
	if err != nil {
		return nil, err
	}
	if len(ws) == 0 {
		return nil, errors.New("test/node: the release has no workload")
	}
	return ws, nil
}

// denyAndAllow adds the node to the cluster's deny list in the cluster
// file's ConfigMap, as docs/self-host.md's Revocation says, and measures
// the time to the Runner's connection ended (its pings unanswered); then
// takes it out again and measures the time to the Runner answering.
func (e *env) denyAndAllow(t *testing.T, pg *pinger, runnerID string) {
	t.Helper()
	ctx := t.Context()
	cms := e.cs.CoreV1().ConfigMaps(systemNS)
	cm, err := cms.Get(ctx, deploy.RunnerClustersConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allowed := cm.Data["clusters.yaml"]
	cm.Data["clusters.yaml"] = allowed + fmt.Sprintf("    deny:\n      nodes: [%s]\n", e.nodeName)
	edited := time.Now()
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 2*time.Minute, "the denied node's Runner no longer answering", func() (bool, error) {
		return pg.ping(ctx, runnerID) != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	denied := time.Since(edited)
	cm.Data["clusters.yaml"] = allowed
	edited = time.Now()
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last error
	if err := waitFor(ctx, 2*time.Minute, "the Runner answering once its node is allowed again", func() (bool, error) {
		last = pg.ping(ctx, runnerID)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)", err, last)
	}
	t.Logf("helm: deny the node in the ConfigMap: the Runner unanswered %.1f s after the edit; allowed again: answering %.1f s after the edit",
		denied.Seconds(), time.Since(edited).Seconds())
}

// rotateKeysByHelm runs docs/self-host.md's "Rotating the callout's keys"
// for both keys at once, the xkey and the issuer (server-config mode's
// user-signing key), as its commands say, with the Runner pinged every
// second:
//  1. a new xkey and a new issuer;
//  2. Secrets compass-callout-xkey and compass-callout-signing with seed and
//     next-seed (kubectl apply), helm upgrade --set callout.nextXKey=true
//     --set callout.nextIssuer=true, the rollout (on SQLite the Server's
//     StatefulSet: the callout is in its pod);
//  3. helm upgrade --set callout.xkey=<new X...> --set
//     callout.issuer=<new A...>, kubectl rollout restart statefulset/nats:
//     its three pods restart one at a time;
//  4. the Secrets swapped, both values false, the rollout, the old seeds
//     dropped.
//
// Pinned: no authorization refusal at the Runner, no kick by the callout
// during the roll (the Server's connection among them), and every run of
// unanswered pings either inside a restart of the Server's pod (the door,
// on SQLite) or over within faultRecovery.
func (e *env) rotateKeysByHelm(t *testing.T, h *helmOp, l layout, k *operatorKeys, pg *pinger, runnerID string) {
	t.Helper()
	ctx := t.Context()
	runner, err := e.runnerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refusals := func(what string) float64 {
		t.Helper()
		m, err := e.scrapeRunner(ctx)
		if err != nil {
			t.Fatalf("scraping the Runner %s: %v", what, err)
		}
		// A series every Runner has, so that a scrape of something else
		// fails here rather than reading as no refusal.
		if _, err := m.must("compass_runner_nats_connected", nil); err != nil {
			t.Fatalf("scraping the Runner %s: %v", what, err)
		}
		v, _ := m.value("compass_runner_nats_connect_failures_total", map[string]string{"cause": "authorization_refused"})
		return v
	}
	refusedBefore := refusals("before the rotation")

	// 1. The new keys, in files as nk writes them: an xkey and an issuer
	// (the callout's signing key), both rotated in the one roll.
	dir := t.TempDir()
	type rotated struct {
		secret, cur, next, pub string
		kp                     nkeys.KeyPair
	}
	newKey := func(name string, seed []byte, create func() (nkeys.KeyPair, error)) rotated {
		t.Helper()
		kp, err := create()
		if err != nil {
			t.Fatal(err)
		}
		nextSeed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		r := rotated{secret: "compass-" + name, cur: filepath.Join(dir, name+".nk"), next: filepath.Join(dir, name+"-next.nk"), pub: pub, kp: kp}
		if err := errors.Join(os.WriteFile(r.cur, seed, 0o600), os.WriteFile(r.next, nextSeed, 0o600)); err != nil {
			t.Fatal(err)
		}
		return r
	}
	xk := newKey("callout-xkey", k.xkeySeed, nkeys.CreateCurveKeys)
	iss := newKey("callout-signing", k.accountSeed, nkeys.CreateAccount)
	keys := []rotated{xk, iss}
	nextOn := []string{"callout.nextXKey=true", "callout.nextIssuer=true"}
	nextOff := []string{"callout.nextXKey=false", "callout.nextIssuer=false"}
	// Step 3's values: server-config mode names the new public keys in the
	// chart's auth_callout block; operator mode gives the resolver nsc
	// writes after the recipe's rotation (nsc edit authcallout --curve
	// <new>, nsc edit account AUTH --sk <new> --rm-sk <old>, the same for
	// RUNNERS, nsc generate config --mem-resolver): AUTH's and RUNNERS'
	// JWTs list the kept users' key and the callout's new keys only.
	step3 := []string{"--set", "callout.xkey=" + xk.pub, "--set", "callout.issuer=" + iss.pub}
	what3 := "callout.xkey, callout.issuer"
	if l.operator {
		us := newKey("callout-user-signing", l.nats.userSigningSeed, nkeys.CreateAccount)
		keys = append(keys, us)
		nextOn = append(nextOn, "callout.nextUserSigning=true")
		nextOff = append(nextOff, "callout.nextUserSigning=false")
		next := natsembed.CalloutKeys{XKey: xk.kp, Issuer: iss.kp, UserSigning: us.kp}
		resolver := filepath.Join(dir, "resolver.conf")
		if err := os.WriteFile(resolver, []byte(l.nats.recipe.Resolver(t, next.XKey, next)), 0o600); err != nil {
			t.Fatal(err)
		}
		step3 = []string{"--set-file", "nats.operator.resolver=" + resolver}
		what3 = "nats.operator.resolver (--set-file)"
	}
	secretApply := func(what string, r rotated, files ...string) {
		t.Helper()
		args := []string{"-n", systemNS, "create", "secret", "generic", r.secret}
		for _, f := range files {
			args = append(args, "--from-file="+f)
		}
		out, err := e.kubectlRun(ctx, nil, append(args, "--dry-run=client", "-o", "yaml")...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if _, err := e.kubectlRun(ctx, []byte(out), "apply", "-f", "-"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var restarts []window
	rollServer := func(what string, sets ...string) {
		t.Helper()
		from := time.Now()
		h.upgrade(what, sets...)
		if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "rollout", "status", l.callout(), "--timeout=5m"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !l.postgres {
			// On SQLite the callout is in the Server's pod, which is the
			// door: it answers again once that pod is ready and the
			// Runner's next ping goes through it, so the window ends
			// faultRecovery after the rollout. On PostgreSQL the callout
			// is a Deployment of its own and the door never stops.
			restarts = append(restarts, window{what: what, from: from, to: time.Now().Add(faultRecovery)})
		}
		t.Logf("helm: %s: %s: helm upgrade and the rollout of %s %.1f s", l.name, what, l.callout(), time.Since(from).Seconds())
	}

	log := startPingLog(ctx, pg, runnerID)
	began := time.Now()

	// 2. The callout holds both keys.
	for _, r := range keys {
		secretApply("step 2: the Secret with next-seed", r, "seed="+r.cur, "next-seed="+r.next)
	}
	rollServer("step 2: "+strings.Join(nextOn, ", "), nextOn...)
	kicks := func(what string) float64 {
		t.Helper()
		var v float64
		var last error
		if err := waitFor(ctx, time.Minute, "the callout's metrics "+what, func() (bool, error) {
			ms, err := e.scrapeCallouts(ctx, l)
			if last = err; err != nil {
				return false, nil
			}
			v = 0
			for _, m := range ms {
				// The kicker's sweeps are counted from its start: a scrape
				// without them is not the callout's, or it runs no kicker.
				if _, last = m.must("compass_callout_kick_sweeps_total", nil); last != nil {
					return false, nil
				}
				n, _ := m.value("compass_callout_kicks_total", nil)
				v += n
			}
			return true, nil
		}); err != nil {
			t.Fatalf("%v (last: %v)", err, last)
		}
		return v
	}
	kicksBefore := kicks("before the NATS roll")

	// 3. NATS on the new key, one pod at a time.
	roll := time.Now()
	h.upgradeArgs("step 3: "+what3, step3...)
	if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "rollout", "restart", "statefulset/"+natsStatefulSet); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "rollout", "status", "statefulset/"+natsStatefulSet, "--timeout=10m"); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, time.Minute, "every NATS server ready on the new revision", func() (bool, error) { return e.natsReady(ctx) }); err != nil {
		t.Fatal(err)
	}
	rolled := time.Since(roll)
	var lastPing error
	if err := waitFor(ctx, time.Minute, "the Runner answering after the NATS roll", func() (bool, error) {
		lastPing = pg.ping(ctx, runnerID)
		return lastPing == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)", err, lastPing)
	}
	if got := kicks("after the NATS roll"); got != kicksBefore {
		t.Errorf("the callout kicked %v connections during the NATS roll (compass_callout_kicks_total %v -> %v): a reconnect is no duplicate, and the Server's connection is never judged",
			got-kicksBefore, kicksBefore, got)
	}
	t.Logf("helm: %s: step 3: helm upgrade %s, and the NATS roll of three pods: %.1f s", l.name, what3, rolled.Seconds())

	// 4. The new key alone.
	for _, r := range keys {
		secretApply("step 4: the Secret swapped", r, "seed="+r.next, "next-seed="+r.cur)
	}
	rollServer("step 4: "+strings.Join(nextOff, ", "), nextOff...)
	for _, r := range keys {
		secretApply("step 4: the old seed dropped", r, "seed="+r.next)
	}
	if err := waitFor(ctx, 2*time.Minute, "the Runner answering after the rotation", func() (bool, error) {
		lastPing = pg.ping(ctx, runnerID)
		return lastPing == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)", err, lastPing)
	}
	pings := log.finish()
	total := time.Since(began)

	// What the Runner saw.
	if now, err := e.runnerPod(ctx); err != nil || now.UID != runner.UID {
		t.Fatalf("the Runner's pod was replaced during the rotation (%v): its refusal count no longer covers it", err)
	}
	if refused := refusals("after the rotation") - refusedBefore; refused != 0 {
		t.Errorf("the Runner was refused %v times during the rotation, want 0\n%s", refused, e.logLines(ctx, runnerNS, runner.Name, "runner", 10, "refused", "authorization"))
	}
	unanswered, longest := 0, time.Duration(0)
	for _, o := range outages(pings) {
		var in string
		for _, w := range restarts {
			if w.covers(o) {
				in = w.what
			}
		}
		if in != "" {
			t.Logf("helm: %s: pings unanswered for %.1f s during %s (the door is the Server's pod on SQLite)", l.name, o.to.Sub(o.from).Seconds(), in)
			continue
		}
		unanswered++
		longest = max(longest, o.to.Sub(o.from))
		if o.to.Sub(o.from) > faultRecovery {
			t.Errorf("pings unanswered for %s from %s, outside a restart of the Server's pod: want at most %s (last: %v)\n%s\n%s\n%s",
				o.to.Sub(o.from).Round(100*time.Millisecond), o.from.Format(time.TimeOnly), faultRecovery, o.last,
				e.logLines(ctx, runnerNS, runner.Name, "runner", 20, "NATS", "nats"),
				e.calloutLogLines(ctx, l, 20, "NATS", "nats", "dropped", "slow", "responder"),
				e.natsLogLines(ctx, 15, "oute", "ame duck", "Server is ready"))
		}
	}
	failed := 0
	for _, p := range pings {
		if p.err != nil {
			failed++
		}
	}
	causes := map[string]float64{}
	if m, err := e.scrapeRunner(ctx); err == nil {
		for _, c := range []string{"authorization_refused", "slow_auth", "network"} {
			causes[c], _ = m.value("compass_runner_nats_connect_failures_total", map[string]string{"cause": c})
		}
	}
	t.Logf("helm: %s: the callout's keys rotated by helm upgrade (%d keys): %.1f s in all, %d pings, %d unanswered; outside the Server's restarts %d runs of unanswered pings, the longest %.1f s; 0 authorization refusals, 0 kicks during the NATS roll; the Runner's failed connects since its start by cause: %v",
		l.name, len(keys), total.Seconds(), len(pings), failed, unanswered, longest.Seconds(), causes)
}

// natsLogLines are logLines of every NATS pod's nats-server.
func (e *env) natsLogLines(ctx context.Context, n int, subs ...string) string {
	return e.podsLogLines(ctx, natsSelector, "nats", n, subs...)
}

// calloutLogLines are logLines of every callout container of the layout.
func (e *env) calloutLogLines(ctx context.Context, l layout, n int, subs ...string) string {
	if !l.postgres {
		return e.logLines(ctx, systemNS, serverPod, "callout", n, subs...)
	}
	return e.podsLogLines(ctx, "app.kubernetes.io/name=compass-callout", "callout", n, subs...)
}

// podsLogLines are logLines of container in every pod of the callout
// namespace that selector selects.
func (e *env) podsLogLines(ctx context.Context, selector, container string, n int, subs ...string) string {
	pods, err := e.cs.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Sprintf("(pods %s: %v)", selector, err)
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, e.logLines(ctx, systemNS, p.Name, container, n, subs...))
	}
	return strings.Join(out, "\n")
}

// nonDeployerRefused: a cluster administrator outside policy.deployers
// upgrades the release with a change to the Runner DaemonSet; the policy
// refuses it, and the DaemonSet is as it was.
func (e *env) nonDeployerRefused(t *testing.T, h *helmOp) {
	t.Helper()
	ctx := t.Context()
	r := helm.Run(t, h.bin, append([]string{"upgrade", release, h.chart, "--namespace", systemNS, "--reuse-values",
		"--set", "runner.priorityClassName=system-node-critical"}, as(nonDeployer, "system:masters")...)...)
	if r.Err == nil || !strings.Contains(string(r.Stderr), msgDeployer) {
		t.Fatalf("a non-deployer's helm upgrade changing the DaemonSet: %v, want the policy's refusal\n%s", r.Err, r.Stderr)
	}
	ds, err := e.cs.AppsV1().DaemonSets(runnerNS).Get(ctx, deploy.RunnerDaemonSet, metav1.GetOptions{})
	if err != nil || ds.Spec.Template.Spec.PriorityClassName == "system-node-critical" {
		t.Fatalf("the DaemonSet after the refused upgrade: %v, priority class %q", err, ds.Spec.Template.Spec.PriorityClassName)
	}
	t.Logf("helm: a non-deployer's upgrade of the DaemonSet: refused (%s)", msgDeployer)
}

// backupUninstallReinstall runs docs/store.md's backup (SQLite: through
// the Server's pod; PostgreSQL: pg_dump), helm uninstall, and helm install
// again with the release's values: the account token minted before the
// uninstall still pings the Runner, so the Server's database outlived the
// release (on SQLite its claim is the StatefulSet's, which helm uninstall
// leaves; on PostgreSQL the database is outside the cluster).
func (e *env) backupUninstallReinstall(t *testing.T, h *helmOp, l layout, d *deployment, pg *pinger) {
	t.Helper()
	ctx := t.Context()

	// The backup, exactly as docs/store.md writes it.
	start := time.Now()
	var size int
	if l.postgres {
		size = l.db.dump(t)
	} else {
		out, err := e.kubectlRun(ctx, nil, "-n", systemNS, "exec", l.server(), "-c", "server", "--", "compass-server", "backup", "--to", "-")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out, "SQLite format 3\x00") {
			t.Fatalf("the backup is not an SQLite database (%d bytes)", len(out))
		}
		size = len(out)
	}
	t.Logf("helm: %s: backup: %.1f s, %d bytes", l.name, time.Since(start).Seconds(), size)

	// The release's values, with every --set of the procedures since the
	// install (the rotated keys among them), as docs/helm.md says to keep
	// them before an uninstall: the install's own file names the old keys.
	r := helm.Run(t, h.bin, append([]string{"get", "values", release, "--namespace", systemNS, "-o", "yaml"}, asDeployer()...)...)
	if r.Err != nil {
		t.Fatalf("helm get values: %v\n%s", r.Err, r.Stderr)
	}
	myValues := filepath.Join(t.TempDir(), "my-values.yaml")
	if err := os.WriteFile(myValues, r.Stdout, 0o600); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	h.run("helm uninstall", append([]string{"uninstall", release, "--namespace", systemNS}, asDeployer()...)...)
	if err := waitFor(ctx, helmStepWait, "the Runner's namespace and the release's pods gone", func() (bool, error) {
		_, err := e.cs.CoreV1().Namespaces().Get(ctx, runnerNS, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		pods, err := e.cs.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			// The migrate Job is no object of the release (it is applied
			// apart); its finished pod stays.
			if p.Status.Phase != corev1.PodSucceeded {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
	uninstalled := time.Since(start)
	if !l.postgres {
		if _, err := e.cs.CoreV1().PersistentVolumeClaims(systemNS).Get(ctx, "data-"+serverPod, metav1.GetOptions{}); err != nil {
			t.Fatalf("the Server's claim after helm uninstall: %v", err)
		}
	}
	if _, err := e.cs.CoreV1().Secrets(systemNS).Get(ctx, "compass-callout-xkey", metav1.GetOptions{}); err != nil {
		t.Fatalf("the operator's Secret after helm uninstall: %v", err)
	}

	start = time.Now()
	h.values = myValues
	took := h.install(asDeployer())
	// The Service is a new object with a new address: a new client.
	if err := waitFor(ctx, helmStepWait, "the reinstalled Server's Service", func() (bool, error) {
		var err error
		pg, err = e.newPinger(ctx, d)
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	var last error
	if err := waitFor(ctx, helmStepWait, "the first pong after the reinstall, with the token minted before the uninstall", func() (bool, error) {
		last = pg.ping(ctx, d.runnerID)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%v (last ping: %v)\n%v", err, last, e.podSummary(ctx))
	}
	t.Logf("helm: %s: helm uninstall: %.1f s to the Runner's namespace and the release's pods gone; reinstall: helm %.1f s, first pong %.1f s after it began, with the account token minted before the uninstall (data kept)",
		l.name, uninstalled.Seconds(), took.Seconds(), time.Since(start).Seconds())
}

// migrateJob applies the migrate Job as docs/helm.md renders it apart
// (helm template --show-only, the release's values) and waits for it.
func (e *env) migrateJob(t *testing.T, h *helmOp) {
	t.Helper()
	ctx := t.Context()
	r := helm.Run(t, h.bin, "template", release, h.chart, "--namespace", systemNS, "-f", h.values,
		"--set", "server.migrateJob=true", "--show-only", "templates/server-migrate-job.yaml")
	if r.Err != nil {
		t.Fatalf("helm template the migrate Job: %v\n%s", r.Err, r.Stderr)
	}
	if _, err := e.kubectlRun(ctx, r.Stdout, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the migrate Job: %v", err)
	}
	if _, err := e.kubectlRun(ctx, nil, "-n", systemNS, "wait", "--for=condition=complete", "job/"+deploy.ServerMigrateJob, "--timeout=5m"); err != nil {
		t.Fatal(errors.Join(err, e.podSummary(ctx)))
	}
}

// scrapeCallouts scrapes every callout: on SQLite the container in the
// Server's pod, on PostgreSQL each pod of the callout Deployment.
func (e *env) scrapeCallouts(ctx context.Context, l layout) ([]metrics, error) {
	if !l.postgres {
		m, err := e.scrapeServerPod(ctx, calloutPort)
		return []metrics{m}, err
	}
	pods, err := e.cs.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=compass-callout"})
	if err != nil {
		return nil, err
	}
	var out []metrics
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || !podReady(&p) {
			continue
		}
		// A callout pod of its own listens on 9090 (the chart's
		// Callout.MetricsPort; 9091 only beside the Server).
		m, err := scrape(ctx, p.Status.PodIP, serverMetricsPort)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("test/node: no ready callout pod")
	}
	return out, nil
}
