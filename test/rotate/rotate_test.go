// Package rotate runs the documented rotation of compass-callout's keys
// (docs/self-host.md, "Rotating the callout's keys") on a three-node cluster
// of the real nats-server binary (COMPASS_TEST_NATS_SERVER), with Runners
// connected and the Server pinging every Runner every second.
//
// nats-server cannot reload an auth_callout block, so the new keys reach the
// cluster as its nodes restart one at a time, the way a StatefulSet rolls:
// the callout is first given the next keys beside the current ones (a new
// replica replaces the old), every node is stopped (SIGTERM) and started on
// the new configuration in turn, and the callout is then left with the new
// keys alone. Throughout, every ping must be answered, except those to the
// Runners of the node being restarted, each of which must answer again
// within backBound of its node's stop; no Runner may see an authorization
// error.
//
// Each case runs COMPASS_ROTATE_RUNNERS Runners (default 30, which the race
// detector affords; docs/performance.md has 300) and logs how many pings
// were sent and failed and how long each restarted node's Runners took to
// answer again.
package rotate

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// The target and the bounds of the waits.
const (
	// backBound is the requirement: a restarted node's Runners answer again
	// within 10 s of its stop.
	backBound = 10 * time.Second
	// pingEvery is how often every Runner is pinged; pingTimeout how long a
	// ping may take before it counts as unanswered.
	pingEvery   = time.Second
	pingTimeout = 2 * time.Second
	// waitTimeout bounds a start (a node, the callout, the Runners) on a
	// loaded two-core machine; routeTimeout the routes' forming.
	waitTimeout  = 60 * time.Second
	routeTimeout = 20 * time.Second
)

// runnersEnv sets the number of Runners (default 30).
const runnersEnv = "COMPASS_ROTATE_RUNNERS"

func runnerCount(t *testing.T) int {
	t.Helper()
	n := 30
	if s := os.Getenv(runnersEnv); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 3 {
			t.Fatalf("%s=%q: want a number of at least 3", runnersEnv, s)
		}
	}
	return n
}

// The rotation in each mode: the xkey alone and the issuer alone in
// server-config mode, where a request names its issuer and is opened with
// whichever xkey it was sealed to; and in operator mode the xkey with both
// signing keys (the callout account's and the Runners' account's), which a
// request tells by its xkey alone.
func TestRotationRollsThroughTheCluster(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode callout.Mode
		rot  rotated
	}{
		{"server-config xkey", callout.ModeServerConfig, rotated{xkey: true}},
		{"server-config issuer", callout.ModeServerConfig, rotated{issuer: true}},
		{"operator xkey and signing keys", callout.ModeOperator, rotated{xkey: true, issuer: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			natsembed.Binary(t)
			s := newStack(t, tc.mode, tc.rot)
			s.roll(t)
		})
	}
}

// stack is the cluster, the callout, the Runners and the Server's pinger.
type stack struct {
	dir    string
	keys   *keyring
	ports  []ports
	nodes  []*natsembed.Process
	urls   string
	issuer *kubeissuer.Issuer
	// clusters is the cluster file the callouts verify tokens with.
	clusters string
	runners  []*handle
	pinger   *pinger
}

func newStack(t *testing.T, mode callout.Mode, rot rotated) *stack {
	t.Helper()
	s := &stack{dir: t.TempDir()}
	s.keys = newKeyring(t, s.dir, mode, rot)
	var err error
	if s.issuer, err = kubeissuer.New(kubeissuer.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.issuer.Close() })
	ca, err := s.issuer.WriteCAFileIn(s.dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	s.clusters = filepath.Join(s.dir, "clusters.yaml")
	if err := os.WriteFile(s.clusters, fmt.Appendf(nil, "clusters:\n  - name: prod\n    issuer: %s\n    caFile: %s\n", s.issuer.URL(), ca), 0o600); err != nil {
		t.Fatal(err)
	}

	free := testutil.FreePorts(t, 9)
	var urls []string
	for i := range 3 {
		s.ports = append(s.ports, ports{client: free[3*i], cluster: free[3*i+1], monitor: free[3*i+2]})
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", free[3*i]))
	}
	s.urls = strings.Join(urls, ",")
	for i := range 3 {
		s.nodes = append(s.nodes, natsembed.StartProcess(t, s.keys.conf(&s.keys.old, i, s.ports)))
	}
	for i := range 3 {
		s.waitRouted(t, i)
	}
	return s
}

// waitRouted waits until node i routes to both others, by its /routez.
func (s *stack) waitRouted(t *testing.T, i int) {
	t.Helper()
	testutil.Eventually(t, routeTimeout, fmt.Sprintf("n%d to route to both other nodes", i), func() bool {
		resp, err := http.Get(s.nodes[i].MonitorURL + "/routez")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var rz struct {
			Routes []struct {
				RemoteName string `json:"remote_name"`
			} `json:"routes"`
		}
		if json.NewDecoder(resp.Body).Decode(&rz) != nil {
			return false
		}
		peers := map[string]bool{}
		for _, r := range rz.Routes {
			peers[r.RemoteName] = true
		}
		return len(peers) == len(s.nodes)-1
	})
}

// calloutRun is one compass-callout (callout.Serve, as the binary runs it).
type calloutRun struct {
	name    string
	metrics string
	cancel  context.CancelFunc
	done    chan error
	logs    *testlog.Buffer
}

// startCallout runs a callout holding gens and returns once it answers.
func (s *stack) startCallout(t *testing.T, name string, gens ...*generation) *calloutRun {
	t.Helper()
	cfg := s.keys.serveConfig(s.urls, gens...)
	c := &calloutRun{name: name, done: make(chan error, 1), logs: &testlog.Buffer{}}
	cfg.RunnerClusters, cfg.MetricsAddr = s.clusters, "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(c.logs, nil))
	ready := make(chan string, 1)
	cfg.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- callout.Serve(ctx, cfg) }()
	t.Cleanup(func() {
		c.stop(t)
		if t.Failed() {
			t.Logf("%s log:\n%s", name, c.logs)
		}
	})
	select {
	case c.metrics = <-ready:
	case err := <-c.done:
		c.done <- err
		t.Fatalf("%s: callout.Serve: %v\n%s", name, err, c.logs)
	case <-time.After(waitTimeout):
		t.Fatalf("%s did not become ready:\n%s", name, c.logs)
	}
	return c
}

// stop drains the callout, as a rolling update's SIGTERM does. Calling it
// again does nothing.
func (c *calloutRun) stop(t *testing.T) {
	t.Helper()
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	if err := <-c.done; err != nil {
		t.Errorf("%s: callout.Serve: %v", c.name, err)
	}
}

var keyAnswersLine = regexp.MustCompile(`^compass_callout_key_answers_total\{key="([^"]+)",role="([^"]+)"\} (\S+)$`)

// keyAnswers scrapes compass_callout_key_answers_total by role and key.
func (c *calloutRun) keyAnswers(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := keyAnswersLine.FindStringSubmatch(sc.Text()); m != nil {
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				t.Fatal(err)
			}
			out[m[2]+" "+m[1]] = v
		}
	}
	return out
}

// handle is one Runner: a real runner.Runner with a projected token.
type handle struct {
	id    string
	r     *runner.Runner
	logs  *testlog.Buffer
	mu    sync.Mutex
	auths []string    // authorization errors it saw
	recon []time.Time // when its link reconnected
}

func (h *handle) event(ev runner.LinkEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch ev.Kind {
	case runner.EventAuthError:
		h.auths = append(h.auths, fmt.Sprint(ev.Err))
	case runner.EventReconnected:
		h.recon = append(h.recon, time.Now())
	}
}

// reconnectedAfter is when the Runner's link first reconnected after t
// (zero: not yet).
func (h *handle) reconnectedAfter(t time.Time) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, at := range h.recon {
		if !at.Before(t) {
			return at
		}
	}
	return time.Time{}
}

// startRunners starts n Runners, each given one node's URL (they learn the
// others from the servers, as in production), with compass-runner's default
// reconnect policy.
func (s *stack) startRunners(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		node := fmt.Sprintf("worker-%d.example", i)
		h := &handle{id: verifier.WorkloadRunnerID("prod", node), logs: &testlog.Buffer{}}
		path := filepath.Join(s.dir, fmt.Sprintf("token-%d", i))
		if _, err := s.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(h.logs, nil))
		r, err := runner.New(runner.Config{
			RunnerID: h.id, Version: "rotate", Tokens: runner.NewFileToken(path, log, nil), TokenFile: path,
			NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", s.ports[i%3].client), Heartbeat: -1, Logger: log,
			Link: runner.LinkConfig{OnEvent: h.event},
		})
		if err != nil {
			t.Fatal(err)
		}
		h.r = r
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Runner %s: %v", h.id, err)
				}
			case <-time.After(runner.DrainTimeout + 5*time.Second):
				t.Errorf("Runner %s did not stop", h.id)
			}
		})
		s.runners = append(s.runners, h)
	}
}

// serverOpts is how the Compass Server authenticates to NATS.
func (s *stack) serverOpts() []nats.Option {
	if s.keys.mode == callout.ModeOperator {
		return []nats.Option{nats.UserCredentials(s.keys.serverCreds)}
	}
	return []nats.Option{nats.UserInfo(natsembed.ServerUser, natsembed.ServerPassword)}
}

// ping is one ping's outcome.
type ping struct {
	runner   int
	sent     time.Time
	answered time.Time // zero: unanswered
	err      string
}

// pinger is the Compass Server pinging every Runner every second, on a
// connection to a node that is not being restarted: one connection per node,
// without reconnects, dialled again after its node restarts.
type pinger struct {
	s       *stack
	mu      sync.Mutex
	conns   []*nats.Conn
	flights []*sync.WaitGroup // pings in flight per connection
	via     int               // the node pings go through
	results []ping
	stop    chan struct{}
	stopped chan struct{}
}

func (s *stack) startPinger(t *testing.T) *pinger {
	t.Helper()
	p := &pinger{s: s, conns: make([]*nats.Conn, 3), stop: make(chan struct{}), stopped: make(chan struct{})}
	for i := range 3 {
		p.flights = append(p.flights, &sync.WaitGroup{})
		p.dial(t, i)
	}
	t.Cleanup(func() {
		for _, nc := range p.conns {
			nc.Close()
		}
	})
	go p.run()
	return p
}

// dial connects the Server to node i alone.
func (p *pinger) dial(t *testing.T, i int) {
	t.Helper()
	opts := append([]nats.Option{nats.Name("compass-server"), nats.NoReconnect(), nats.DontRandomize()}, p.s.serverOpts()...)
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", p.s.ports[i].client), opts...)
	if err != nil {
		t.Fatalf("compass-server to n%d: %v", i, err)
	}
	p.mu.Lock()
	old := p.conns[i]
	p.conns[i] = nc
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// avoid moves the pings off node i and waits until the pings in flight
// through it have ended, so that stopping it fails none of them.
func (p *pinger) avoid(i int) {
	p.mu.Lock()
	p.via = (i + 1) % 3
	wg := p.flights[i]
	p.mu.Unlock()
	wg.Wait()
}

func (p *pinger) run() {
	defer close(p.stopped)
	tick := time.NewTicker(pingEvery)
	defer tick.Stop()
	var all sync.WaitGroup
	defer all.Wait()
	for {
		for i, h := range p.s.runners {
			p.mu.Lock()
			nc, wg := p.conns[p.via], p.flights[p.via]
			wg.Add(1)
			p.mu.Unlock()
			all.Add(1)
			go func() {
				defer all.Done()
				defer wg.Done()
				res := pingOnce(nc, i, h.id)
				p.mu.Lock()
				p.results = append(p.results, res)
				p.mu.Unlock()
			}()
		}
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
	}
}

// pingOnce sends the ping command as the Server does and checks that the
// answer comes from the Runner.
func pingOnce(nc *nats.Conn, i int, id string) ping {
	res := ping{runner: i, sent: time.Now()}
	subj, err := subjects.Command(id)
	if err != nil {
		res.err = err.Error()
		return res
	}
	m, err := nc.Request(subj, []byte(`{"command":"ping"}`), pingTimeout)
	if err != nil {
		res.err = err.Error()
		return res
	}
	var resp runner.Response
	var pr runner.PingResult
	if err := json.Unmarshal(m.Data, &resp); err != nil || !resp.OK || json.Unmarshal(resp.Result, &pr) != nil || !pr.Pong || pr.RunnerID != id {
		res.err = "unexpected answer: " + string(m.Data)
		return res
	}
	res.answered = time.Now()
	return res
}

// finish stops the pinging and returns every ping's outcome.
func (p *pinger) finish() []ping {
	close(p.stop)
	<-p.stopped
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.results)
}

// answeredSince reports whether every Runner of idx answered a ping sent
// at or after since.
func (p *pinger) answeredSince(idx []int, since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	back := map[int]bool{}
	for _, r := range p.results {
		if !r.answered.IsZero() && !r.sent.Before(since) {
			back[r.runner] = true
		}
	}
	for _, i := range idx {
		if !back[i] {
			return false
		}
	}
	return true
}

// restart is one node's restart: when it was stopped, which Runners were on
// it, and when it was up and routed again.
type restart struct {
	node     int
	stopped  time.Time
	up       time.Time
	affected []int
}

// roll runs the documented procedure and checks the pings.
func (s *stack) roll(t *testing.T) {
	t.Helper()
	k := s.keys
	a := s.startCallout(t, "callout-old", &k.old)
	s.startRunners(t, runnerCount(t))
	all := make([]int, len(s.runners))
	for i := range all {
		all[i] = i
	}
	s.pinger = s.startPinger(t)
	began := time.Now()
	testutil.Eventually(t, waitTimeout, "every Runner to answer a ping", func() bool { return s.pinger.answeredSince(all, began) })
	start := time.Now() // the procedure starts; every ping from here on counts

	// 1. The callout gets the next keys beside the current ones: a replica
	// holding both replaces the old one.
	b := s.startCallout(t, "callout-both", &k.old, &k.new)
	a.stop(t)

	// 2. Every node restarts on the new configuration, one at a time.
	var restarts []restart
	for i := range s.nodes {
		restarts = append(restarts, s.restartNode(t, i))
	}
	during := b.keyAnswers(t)

	// 3. The callout keeps the new keys alone.
	c := s.startCallout(t, "callout-new", &k.new)
	b.stop(t)
	end := time.Now()
	testutil.Eventually(t, waitTimeout, "a round of pings after the roll", func() bool { return s.pinger.answeredSince(all, end) })
	results := s.pinger.finish()

	s.check(t, start, restarts, results)
	s.checkKeys(t, during)
	// The callout left with the new keys alone authorizes on every node.
	for i := range s.nodes {
		tok, err := s.issuer.Token(kubeissuer.Pod{NodeName: fmt.Sprintf("probe-%d.example", i)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", s.ports[i].client), nats.Token(tok), nats.NoReconnect())
		if err != nil {
			t.Fatalf("a new Runner on n%d after the rotation: %v\n%s", i, err, c.logs)
		}
		nc.Close()
	}
}

// restartNode stops node i (SIGTERM, as the kubelet does), starts it on the
// new configuration at the same ports, and waits until it routes to the
// others and the Runners it had answer again.
func (s *stack) restartNode(t *testing.T, i int) restart {
	t.Helper()
	s.pinger.avoid(i)
	p := s.nodes[i]
	id := s.pinger.serverID(i)
	rs := restart{node: i}
	for j, h := range s.runners {
		st := h.r.Link().Status()
		if !st.Connected {
			t.Fatalf("Runner %s is not connected before n%d restarts", h.id, i)
		}
		if st.ServerID == id {
			rs.affected = append(rs.affected, j)
		}
	}
	rs.stopped = time.Now()
	if err := syscall.Kill(p.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("n%d to exit", i), func() bool { return strings.Contains(p.Log(), "Server Exiting") })
	p.Kill() // reaps it
	s.nodes[i] = natsembed.StartProcess(t, s.keys.conf(&s.keys.new, i, s.ports))
	for j := range s.nodes {
		s.waitRouted(t, j)
	}
	rs.up = time.Now()
	s.pinger.dial(t, i)
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("n%d's %d Runners to answer again", i, len(rs.affected)),
		func() bool { return s.pinger.answeredSince(rs.affected, rs.stopped) })
	return rs
}

// serverID is the ID of the server the pinger's connection to node i is on.
func (p *pinger) serverID(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[i].ConnectedServerId()
}

// check holds the pings to the target: every ping from start on was
// answered, except, for each restart, those to its Runners sent from a
// ping's timeout before the stop until their first answer after it, which
// came within backBound; and no Runner saw an authorization error.
func (s *stack) check(t *testing.T, start time.Time, restarts []restart, results []ping) {
	t.Helper()
	type window struct{ from, to time.Time }
	excused := map[int][]window{}
	for _, rs := range restarts {
		var backs, recons []time.Duration
		for _, j := range rs.affected {
			if at := s.runners[j].reconnectedAfter(rs.stopped); !at.IsZero() {
				recons = append(recons, at.Sub(rs.stopped))
			}
			var first time.Time
			for _, r := range results {
				if r.runner == j && !r.answered.IsZero() && !r.sent.Before(rs.stopped) && (first.IsZero() || r.answered.Before(first)) {
					first = r.answered
				}
			}
			back := first.Sub(rs.stopped)
			if first.IsZero() || back > backBound {
				t.Errorf("Runner %s of n%d answered again %s after its node stopped, want within %s", s.runners[j].id, rs.node, back.Round(time.Millisecond), backBound)
			}
			backs = append(backs, back)
			excused[j] = append(excused[j], window{rs.stopped.Add(-pingTimeout), first})
		}
		slices.Sort(backs)
		slices.Sort(recons)
		if len(backs) > 0 && len(recons) > 0 {
			t.Logf("n%d: stopped, up and routed on the new keys after %s; its %d Runners reconnected after %s (median), %s (max), and answered a ping (sent every %s) again after %s (median), %s (max)",
				rs.node, rs.up.Sub(rs.stopped).Round(time.Millisecond), len(backs),
				recons[len(recons)/2].Round(time.Millisecond), recons[len(recons)-1].Round(time.Millisecond), pingEvery,
				backs[len(backs)/2].Round(time.Millisecond), backs[len(backs)-1].Round(time.Millisecond))
		} else {
			t.Errorf("n%d had no Runner when it restarted: the roll proved nothing for it", rs.node)
		}
	}
	sent, failed, excusedN := 0, 0, 0
	var bad []string
	for _, r := range results {
		if r.sent.Before(start) {
			continue
		}
		sent++
		if !r.answered.IsZero() {
			continue
		}
		failed++
		ok := false
		for _, w := range excused[r.runner] {
			ok = ok || (!r.sent.Before(w.from) && r.sent.Before(w.to))
		}
		if ok {
			excusedN++
			continue
		}
		if len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("%s at %s: %s", s.runners[r.runner].id, r.sent.Sub(start).Round(time.Millisecond), r.err))
		}
	}
	t.Logf("%d Runners, %d pings during the rotation, %d unanswered, all to Runners of the node being restarted: %d", len(s.runners), sent, failed, excusedN)
	if failed != excusedN {
		t.Errorf("%d pings unanswered to Runners of no node being restarted, for example:\n%s", failed-excusedN, strings.Join(bad, "\n"))
	}
	for _, h := range s.runners {
		h.mu.Lock()
		auths := slices.Clone(h.auths)
		h.mu.Unlock()
		if st := h.r.Link().Status(); st.AuthRefusals != 0 || len(auths) > 0 {
			t.Errorf("Runner %s saw %d authorization refusals: %v\n%s", h.id, st.AuthRefusals, auths, h.logs)
		}
	}
}

// checkKeys holds that the callout holding both generations answered
// servers of both during the roll: the old generation's keys for the nodes
// not yet restarted, the new generation's for those that were.
func (s *stack) checkKeys(t *testing.T, answers map[string]float64) {
	t.Helper()
	k := s.keys
	want := []string{}
	if k.old.xkey.pub != k.new.xkey.pub {
		want = append(want, callout.KeyRoleXKey+" "+k.old.xkey.pub, callout.KeyRoleXKey+" "+k.new.xkey.pub)
	}
	if k.old.issuer.pub != k.new.issuer.pub {
		want = append(want, callout.KeyRoleIssuer+" "+k.old.issuer.pub, callout.KeyRoleIssuer+" "+k.new.issuer.pub)
	}
	for _, key := range want {
		if answers[key] < 1 {
			t.Errorf("compass_callout_key_answers_total{%s} = %v during the roll, want answers with both generations: %v", key, answers[key], answers)
		}
	}
	t.Logf("answers of the callout holding both generations, by key: %v", answers)
}
