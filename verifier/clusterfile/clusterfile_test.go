package clusterfile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/clusterfile"
)

const (
	node  = "ip-10-0-1-5.ec2.internal"
	other = "ip-10-0-1-6.ec2.internal"
)

type env struct {
	is    *kubeissuer.Issuer
	down  atomic.Bool // the issuer answers 503 to everything
	caPEM string
	dir   string // the ConfigMap volume
	path  string // dir/clusters.yaml, a symlink to ..data/clusters.yaml
	gen   int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{dir: t.TempDir()}
	is, err := kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if e.down.Load() {
				http.Error(w, "unavailable", http.StatusServiceUnavailable)
				return
			}
			next.ServeHTTP(w, r)
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	e.is = is
	e.caPEM = filepath.Join(t.TempDir(), "ca.pem")
	if err := is.WriteCAFile(e.caPEM); err != nil {
		t.Fatal(err)
	}
	e.path = filepath.Join(e.dir, "clusters.yaml")
	return e
}

// file is a cluster file registering e's issuer as cluster a, with deny
// entries for the given nodes.
func (e *env) file(deny ...string) string {
	s := fmt.Sprintf("clusters:\n  - name: a\n    issuer: %s\n    caFile: %s\n", e.is.URL(), e.caPEM)
	if len(deny) > 0 {
		s += "    deny:\n      nodes: [" + strings.Join(deny, ", ") + "]\n"
	}
	return s
}

// publish writes content the way the kubelet updates a ConfigMap volume: a
// new timestamped directory, a new ..data symlink renamed over the old one;
// clusters.yaml is a symlink to ..data/clusters.yaml and never changes.
func (e *env) publish(t *testing.T, content string) {
	t.Helper()
	e.gen++
	ts := fmt.Sprintf("..2026_12_01_00_00_%02d.%d", e.gen, e.gen)
	if err := os.Mkdir(filepath.Join(e.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, ts, "clusters.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(e.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(e.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(e.path); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(filepath.Join("..data", "clusters.yaml"), e.path); err != nil {
			t.Fatal(err)
		}
	}
}

type running struct {
	reg  *clusterfile.Registry
	tick chan time.Time
	hup  chan os.Signal
	log  *testlog.Buffer
	done chan struct{}
}

func start(t *testing.T, e *env, cfg clusterfile.Config) *running {
	t.Helper()
	r := &running{tick: make(chan time.Time), hup: make(chan os.Signal), log: &testlog.Buffer{}, done: make(chan struct{})}
	cfg.Path = e.path
	cfg.HTTPClient = e.is.Client()
	cfg.Logger = slog.New(slog.NewTextHandler(r.log, nil))
	cfg.Signals = r.hup
	cfg.Ticker = func(d time.Duration) (<-chan time.Time, func()) {
		if d != clusterfile.DefaultPollInterval {
			t.Errorf("poll interval %v, want %v", d, clusterfile.DefaultPollInterval)
		}
		return r.tick, func() {}
	}
	reg, err := clusterfile.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.reg = reg
	if err := reg.Verifier().Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() { defer close(r.done); reg.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// poll delivers one poll tick and waits until Run has handled it: Run takes
// the second tick only after it is done with the first. (The second tick's
// own handling may still be under way when poll returns.)
func (r *running) poll(t *testing.T) {
	t.Helper()
	for range 2 {
		select {
		case r.tick <- time.Now():
		case <-time.After(10 * time.Second):
			t.Fatal("Run does not take poll ticks")
		}
	}
}

// sighup delivers a forced reload and waits until Run has handled it.
func (r *running) sighup(t *testing.T) {
	t.Helper()
	select {
	case r.hup <- os.Signal(nil):
	case <-time.After(10 * time.Second):
		t.Fatal("Run does not take the reload signal")
	}
	r.poll(t)
}

func (r *running) verify(t *testing.T, e *env, node string) error {
	t.Helper()
	tok, err := e.is.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.reg.Verifier().Verify(t.Context(), tok)
	return err
}

func (r *running) metrics(t *testing.T) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(r.reg); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if f.GetName() == "compass_cluster_file_applied_timestamp_seconds" {
				continue // a time; checked apart
			}
			out = append(out, f.GetName()+labels(m)+" "+fmt.Sprint(value(m)))
		}
	}
	return strings.Join(out, "\n")
}

func labels(m *dto.Metric) string {
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, l.GetName()+"="+l.GetValue())
	}
	if len(ls) == 0 {
		return ""
	}
	return "{" + strings.Join(ls, ",") + "}"
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

func metricsWant(applied, refused, failing int) string {
	return fmt.Sprintf("compass_cluster_file_reload_failing %d\ncompass_cluster_file_reloads_total{result=applied} %d\ncompass_cluster_file_reloads_total{result=refused} %d",
		failing, applied, refused)
}

const deniedErr = "verifier: unauthenticated: cluster a: node denied: node " + node + " is in deny.nodes"

// A ConfigMap update (the kubelet's symlink swap) is picked up by the next
// poll: a new deny entry takes effect on the next Verify, and removing it
// lets the node in again. Each update read costs one re-fetch of the key
// set (TestRun_ChangedFileRefetchesKeys), none more.
func TestRun_ConfigMapUpdateAppliesDeny(t *testing.T) {
	e := newEnv(t)
	e.publish(t, e.file())
	r := start(t, e, clusterfile.Config{})
	if err := r.verify(t, e, node); err != nil {
		t.Fatal(err)
	}
	fetches := e.is.JWKSFetches()

	r.poll(t) // nothing changed: nothing read
	if got := r.metrics(t); got != metricsWant(0, 0, 0) {
		t.Fatalf("metrics after an idle poll:\n%s", got)
	}
	// No check that the update waits for a poll: poll returns once Run has
	// taken its second tick, whose handling may still see the new file.
	e.publish(t, e.file(node))
	r.poll(t)
	if err := r.verify(t, e, node); err == nil || err.Error() != deniedErr {
		t.Fatalf("denied node after the update: %v, want %s", err, deniedErr)
	}
	if err := r.verify(t, e, other); err != nil {
		t.Fatalf("another node after the update: %v", err)
	}
	if got := r.metrics(t); got != metricsWant(1, 0, 0) {
		t.Fatalf("metrics:\n%s", got)
	}
	if got := e.is.JWKSFetches() - fetches; got != 1 {
		t.Fatalf("%d key fetches for a deny-list change, want 1 (the re-fetch after a changed file)", got)
	}
	if !strings.Contains(r.log.String(), `msg="clusterfile: cluster file applied" path=`+e.path) {
		t.Fatalf("log:\n%s", r.log)
	}

	e.publish(t, e.file())
	r.poll(t)
	if err := r.verify(t, e, node); err != nil {
		t.Fatalf("after the deny entry was removed: %v", err)
	}
	if got := r.metrics(t); got != metricsWant(2, 0, 0) {
		t.Fatalf("metrics:\n%s", got)
	}
}

// A file that does not parse, or fails a check, is refused whole: the
// clusters in force keep verifying, the log says why and where, the metrics
// say it is failing; the same refused file is not refused again every poll,
// and the next good file is applied and clears the gauge.
func TestRun_InvalidFileKeepsClustersInForce(t *testing.T) {
	e := newEnv(t)
	e.publish(t, e.file(node))
	r := start(t, e, clusterfile.Config{})
	if err := r.verify(t, e, node); err == nil || err.Error() != deniedErr {
		t.Fatalf("%v", err)
	}
	before := r.reg.Verifier()

	bad := []struct{ name, content, reason string }{
		{"unknown key", strings.Replace(e.file(), "caFile", "cafile", 1), `cafile: unknown key (line 4)`},
		{"bad deny entry", e.file("Node_A"), `\"Node_A\" is not a Kubernetes node name`},
		{"not YAML", "clusters: [", "verifier:"},
	}
	for i, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			e.publish(t, tc.content)
			r.poll(t)
			r.poll(t) // the same refused file: not counted twice
			if err := r.verify(t, e, node); err == nil || err.Error() != deniedErr {
				t.Fatalf("the clusters in force changed: %v", err)
			}
			if err := r.verify(t, e, other); err != nil {
				t.Fatal(err)
			}
			if got := r.metrics(t); got != metricsWant(0, i+1, 1) {
				t.Fatalf("metrics:\n%s", got)
			}
			logs := r.log.String()
			if !strings.Contains(logs, `level=ERROR msg="clusterfile: new cluster file refused; the clusters in force stay in force" path=`+e.path) ||
				!strings.Contains(logs, tc.reason) || !strings.Contains(logs, "clusters=[a]") {
				t.Fatalf("log does not say why (%s):\n%s", tc.reason, logs)
			}
		})
	}
	if r.reg.Verifier() != before {
		t.Fatal("the verifier was replaced")
	}
	e.publish(t, e.file())
	r.poll(t)
	if err := r.verify(t, e, node); err != nil {
		t.Fatal(err)
	}
	if got := r.metrics(t); got != metricsWant(1, len(bad), 0) {
		t.Fatalf("metrics after a good file:\n%s", got)
	}
}

// SIGHUP reads the file even when nothing a poll looks at changed (an edit
// in place that keeps the size and the modification time); a missing file is
// refused, not fatal.
func TestRun_SIGHUPForcesReload(t *testing.T) {
	e := newEnv(t)
	if err := os.WriteFile(e.path, []byte(e.file(node)), 0o644); err != nil {
		t.Fatal(err)
	}
	r := start(t, e, clusterfile.Config{})
	fi, err := os.Stat(e.path)
	if err != nil {
		t.Fatal(err)
	}
	// Same length, another node denied; size and mtime restored.
	edited := e.file(strings.Replace(node, "1-5", "1-7", 1))
	if len(edited) != int(fi.Size()) {
		t.Fatalf("test bug: edited file is %d bytes, want %d", len(edited), fi.Size())
	}
	if err := os.WriteFile(e.path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(e.path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	r.poll(t)
	if err := r.verify(t, e, node); err == nil || err.Error() != deniedErr {
		t.Fatalf("a poll saw an edit that changes neither size nor mtime: %v", err)
	}
	r.sighup(t)
	if err := r.verify(t, e, node); err != nil {
		t.Fatalf("after SIGHUP: %v", err)
	}
	if got := r.metrics(t); got != metricsWant(1, 0, 0) {
		t.Fatalf("metrics:\n%s", got)
	}
	// SIGHUP with unchanged bytes applies nothing more.
	r.sighup(t)
	if got := r.metrics(t); got != metricsWant(1, 0, 0) {
		t.Fatalf("metrics after a SIGHUP with the same file:\n%s", got)
	}

	if err := os.Remove(e.path); err != nil {
		t.Fatal(err)
	}
	r.poll(t)
	r.poll(t)
	if got := r.metrics(t); got != metricsWant(1, 1, 1) {
		t.Fatalf("metrics with the file gone:\n%s", got)
	}
	if err := r.verify(t, e, other); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.log.String(), "no such file or directory") {
		t.Fatalf("log:\n%s", r.log)
	}
}

// Reload returns ErrRefused with the reason; Open's errors are start-up
// errors and never ErrRefused.
func TestReloadAndOpenErrors(t *testing.T) {
	e := newEnv(t)
	e.publish(t, "clusters: [")
	_, err := clusterfile.Open(t.Context(), clusterfile.Config{Path: e.path})
	if err == nil || errors.Is(err, clusterfile.ErrRefused) || !strings.HasPrefix(err.Error(), "verifier: ") || !strings.Contains(err.Error(), "(in "+e.path+")") {
		t.Fatalf("Open of a bad file: %v", err)
	}
	_, err = clusterfile.Open(t.Context(), clusterfile.Config{Path: filepath.Join(e.dir, "missing.yaml")})
	if err == nil || err.Error() != "verifier: cluster file: stat "+filepath.Join(e.dir, "missing.yaml")+": no such file or directory" {
		t.Fatalf("Open of a missing file: %v", err)
	}

	e.publish(t, e.file())
	reg, err := clusterfile.Open(t.Context(), clusterfile.Config{Path: e.path})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, e.file("Node_A"))
	err = reg.Reload(t.Context())
	if !errors.Is(err, clusterfile.ErrRefused) || !strings.Contains(err.Error(), `deny: nodes[0]: "Node_A" is not a Kubernetes node name`) {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if got := reg.Verifier().Clusters(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("clusters after a refused reload: %v", got)
	}

	// Without a path there is nothing to reload, and Run returns at once.
	none, err := clusterfile.Open(t.Context(), clusterfile.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := none.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	none.Run(t.Context())
}

// The start-up guard (no live minted Runner ID with "/" while clusters are
// registered) runs at Open and at every reload: a reload that registers the
// first cluster while such a token is live is refused.
func TestGuard_SlashIDsAtOpenAndReload(t *testing.T) {
	e := newEnv(t)
	url := "sqlite://" + filepath.Join(t.TempDir(), "compass.db")
	st, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	storetest.InsertLegacyRunnerToken(t, url, "prod/old-node", false)

	e.publish(t, e.file())
	_, err = clusterfile.Open(t.Context(), clusterfile.Config{Path: e.path, Store: st})
	if !errors.Is(err, verifier.ErrReservedRunnerIDs) {
		t.Fatalf("Open with a slash ID live: %v", err)
	}

	e.publish(t, "clusters: []\n")
	r := start(t, e, clusterfile.Config{Store: st})
	e.publish(t, e.file())
	r.poll(t)
	if got := r.reg.Verifier().Clusters(); len(got) != 0 {
		t.Fatalf("clusters registered while a slash ID is live: %v", got)
	}
	if got := r.metrics(t); got != metricsWant(0, 1, 1) {
		t.Fatalf("metrics:\n%s", got)
	}
	if !strings.Contains(r.log.String(), `error="verifier: minted Runner tokens with \"/\" in their ID exist while runner clusters are registered: 1 such token(s)`) {
		t.Fatalf("log:\n%s", r.log)
	}
}
