package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/test/natsembed"
)

// The storm runs against the real nats-server binary (natsembed.BinaryEnv):
// what users run, with its short first PING, and in its own process, so that
// 10,000 Runners fit in this process's open-file limit (each connection is a
// descriptor at both ends).

// Limits of the storm harness, each with its reason.
const (
	// stormFormTimeout bounds a cluster's routes forming on a loaded machine.
	stormFormTimeout = 30 * time.Second
	// stormCalloutName tells the callout's connections from the Runners'.
	stormCalloutName = "compass-callout"
)

// Credentials of the storm servers' own users (they bypass the callout).
const (
	stormCalloutUser, stormCalloutPassword = "callout", "callout-pwd"
)

// stormNATS is the NATS side of a storm: one nats-server, or several joined
// by routes (the first is the seed the others route to; gossip meshes them).
type stormNATS struct {
	t     *testing.T
	nodes []*natsembed.Process
	ids   []string                           // server IDs, by node
	conf  []func(listen, http string) string // each node's configuration
}

func startStormNATS(t *testing.T, nodes, authTimeout int, signer *callout.Signer, xkey *callout.XKey) *stormNATS {
	t.Helper()
	sn := &stormNATS{t: t}
	for i := range nodes {
		cluster := ""
		if nodes > 1 {
			routes := ""
			if i > 0 {
				routes = fmt.Sprintf("routes: [ %q ]", sn.nodes[0].ClusterURL)
			}
			cluster = fmt.Sprintf("cluster { name: storm, listen: \"127.0.0.1:-1\", %s }", routes)
		}
		sn.conf = append(sn.conf, func(listen, http string) string {
			// The harness's callout setup with the xkey on, monitoring on
			// loopback and, for a cluster, a cluster block.
			conf := calloutConf(fmt.Sprintf("server_name: n%d\nlisten: %q\nhttp: %q", i, listen, http),
				stormCalloutUser, stormCalloutPassword, authTimeout, signer.Public(), "xkey: "+xkey.Public(), cluster)
			// For experiments: more configuration for every node (prof_port, say).
			conf += os.Getenv("COMPASS_STORM_SERVER_CONF") + "\n"
			if os.Getenv("COMPASS_LOAD_SERVER_LOGS") != "" {
				conf += "debug: true\n"
			}
			return conf
		})
		sn.nodes = append(sn.nodes, nil)
		sn.ids = append(sn.ids, "")
		sn.start(i, "127.0.0.1:-1", "127.0.0.1:-1")
	}
	if nodes > 1 {
		sn.waitMeshed(t)
	}
	return sn
}

// start (re)starts node i on the given client and monitoring addresses.
func (sn *stormNATS) start(i int, listen, http string) {
	t := sn.t
	t.Helper()
	p := natsembed.StartProcess(t, sn.conf[i](listen, http))
	if dir := os.Getenv("COMPASS_LOAD_SERVER_LOGS"); dir != "" {
		// For diagnosis: the server's own account of each CONNECT, written
		// out when the test ends.
		name := filepath.Join(dir, fmt.Sprintf("storm-n%d-%d.log", i, time.Now().UnixNano()))
		t.Cleanup(func() {
			if err := os.WriteFile(name, []byte(p.Log()), 0o644); err != nil {
				t.Error(err)
			}
		})
	}
	if p.MonitorURL == "" {
		t.Fatalf("node n%d logged no monitoring listener", i)
	}
	var v server.Varz
	monitor(t, p, "/varz", &v)
	sn.nodes[i], sn.ids[i] = p, v.ID
}

// restart kills node i and starts it again where its clients expect it.
func (sn *stormNATS) restart(i int) {
	sn.t.Helper()
	p := sn.nodes[i]
	p.Kill()
	sn.start(i, strings.TrimPrefix(p.URL, "nats://"), strings.TrimPrefix(p.MonitorURL, "http://"))
}

// monitor reads one monitoring endpoint of p into out.
func monitor(t *testing.T, p *natsembed.Process, path string, out any) {
	t.Helper()
	resp, err := http.Get(p.MonitorURL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	if err := json.Unmarshal(body, out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// waitMeshed waits until every node has routes to every other. It polls:
// the routes form inside the server processes, which expose no event.
func (sn *stormNATS) waitMeshed(t *testing.T) {
	t.Helper()
	deadline := time.After(stormFormTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i, p := range sn.nodes {
		for {
			var rz server.Routez
			monitor(t, p, "/routez", &rz)
			peers := map[string]bool{}
			for _, r := range rz.Routes {
				peers[r.RemoteID] = true
			}
			if len(peers) == len(sn.nodes)-1 {
				break
			}
			select {
			case <-tick.C:
			case <-deadline:
				t.Fatalf("n%d has routes to %d peers after %v, want %d", i, len(peers), stormFormTimeout, len(sn.nodes)-1)
			}
		}
	}
}

// node is the index of the node with server ID id, or -1.
func (sn *stormNATS) node(id string) int { return slices.Index(sn.ids, id) }

// servers is the server list of a client placed on node k: node k first
// (nats.go tries Options.Url before the others), then the others, which
// nats.go shuffles (as it does compass-runner's and the callout's lists), so
// a lost node's clients spread over the survivors.
func (sn *stormNATS) servers(k int) nats.Option {
	k %= len(sn.nodes)
	var rest []string
	for i, p := range sn.nodes {
		if i != k {
			rest = append(rest, p.URL)
		}
	}
	return func(o *nats.Options) error {
		o.Url, o.Servers = sn.nodes[k].URL, rest
		return nil
	}
}

func isAuthErr(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired)
}

// startStormCallout runs callout.Responder with full verification on conns
// connections spread over the nodes as compass-callout spreads them
// (connection i starts at node i mod nodes, reconnects to any, forever).
func startStormCallout(t *testing.T, w *world, sn *stormNATS, signer *callout.Signer, xkey *callout.XKey, conns, workers int, observe func(callout.Event)) (*atomic.Int64, *callout.Responder) {
	t.Helper()
	r, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: w.resolver, ResponseSigner: signer, Account: "RUNNERS",
		XKey: xkey, Workers: workers, Observe: observe,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		t.Fatal(err)
	}
	reconnects := &atomic.Int64{}
	natsembed.StartResponder(t, r, dialN(t, conns, func(i int) (*nats.Conn, error) {
		return nats.Connect("", sn.servers(i), nats.UserInfo(stormCalloutUser, stormCalloutPassword), nats.Name(stormCalloutName),
			nats.MaxReconnects(-1), nats.ReconnectHandler(func(*nats.Conn) { reconnects.Add(1) }))
	})...)
	return reconnects, r
}

// laneLag samples, every interval until ctx ends, the callout's own measure
// of its connections' lag (Responder.NATSLag: the PING each connection keeps
// in flight waits behind the answers sent before it, so its time out is how
// long an answer published now waits before the server handles it).
func laneLag(ctx context.Context, r *callout.Responder, interval time.Duration, into *latencies) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			into.add(r.NATSLag())
		}
	}
}

// procCPU is the CPU time (user and system) process pid has used so far, or
// 0 where /proc cannot tell (another OS, or the process is gone).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = 100

// cpuSplit measures where the machine's CPU goes during a storm: this
// process (clients and callout) and each nats-server.
type cpuSplit struct {
	sn    *stormNATS
	at    time.Time
	self  time.Duration
	nodes []time.Duration
}

func newCPUSplit(sn *stormNATS) *cpuSplit {
	c := &cpuSplit{sn: sn}
	c.take()
	return c
}

// take returns the share of one CPU each used since the last take, as
// "harness 150%, n0 40%".
func (c *cpuSplit) take() string {
	now, self := time.Now(), cpuNow()
	nodes := make([]time.Duration, len(c.sn.nodes))
	for i, p := range c.sn.nodes {
		nodes[i] = procCPU(p.PID())
	}
	var parts []string
	if !c.at.IsZero() {
		d := float64(now.Sub(c.at))
		parts = append(parts, fmt.Sprintf("harness %.0f%%", 100*float64(self-c.self)/d))
		for i := range nodes {
			if nodes[i] >= c.nodes[i] {
				parts = append(parts, fmt.Sprintf("n%d %.0f%%", i, 100*float64(nodes[i]-c.nodes[i])/d))
			}
		}
	}
	c.at, c.self, c.nodes = now, self, nodes
	return strings.Join(parts, ", ")
}

// TestReconnectStorm connects COMPASS_STORM_RUNNERS (5,000) Runners, each with
// its own projected token, through compass-callout with full verification and
// xkey, then cuts them and waits for every cut Runner to come back.
//
// With COMPASS_STORM_NODES=1 (the default) the server is killed and started
// again on its ports: every Runner and the callout's connections drop at
// the same instant. With COMPASS_STORM_NODES=3 the Runners and the callout's
// connections are spread over three nodes joined by routes, and node n0 (the
// seed, with its share of both) is killed: its Runners reconnect to the
// other two.
//
// It fails on any cut Runner that does not reconnect within the deadline, on
// any connection closed for good, on any error reported to a client, and on
// any Runner of a surviving node that saw a disconnect. nats.go reports no
// error for a reconnect attempt whose CONNECT fails or times out (it just
// tries again), so wasted attempts are counted from the callout's side:
// authorizations beyond one per Runner back are answers that came too late
// for their client.
func TestReconnectStorm(t *testing.T) {
	gate(t)
	n := testutil.EnvInt(t, "COMPASS_STORM_RUNNERS", 5000)
	nodes := testutil.EnvInt(t, "COMPASS_STORM_NODES", 1)
	// compass-runner's reconnect policy and defaults (runner.ReconnectDelay).
	jitter := time.Duration(testutil.EnvInt(t, "COMPASS_STORM_JITTER_MS", int(runner.DefaultReconnectJitter/time.Millisecond))) * time.Millisecond
	wait := time.Duration(testutil.EnvInt(t, "COMPASS_STORM_WAIT_MS", int(runner.DefaultReconnectWait/time.Millisecond))) * time.Millisecond
	maxJitter := time.Duration(testutil.EnvInt(t, "COMPASS_STORM_MAX_JITTER_MS", int(runner.DefaultMaxReconnectJitter/time.Millisecond))) * time.Millisecond
	conns := testutil.EnvInt(t, "COMPASS_LOAD_CALLOUT_CONNS", 4)
	workers := testutil.EnvInt(t, "COMPASS_LOAD_CALLOUT_WORKERS", 8)
	deadline := time.Duration(testutil.EnvInt(t, "COMPASS_STORM_DEADLINE_S", 300)) * time.Second
	authTimeout := testutil.EnvInt(t, "COMPASS_STORM_AUTH_TIMEOUT_S", 5) // as in deploy/nats
	// Lame duck: n0 leaves as the rendered pods' preStop makes it leave
	// (nats-server --signal ldm, SIGUSR2), with the rendered
	// lame_duck_duration and grace period, instead of being killed.
	lameDuck := os.Getenv("COMPASS_STORM_LAME_DUCK") == "1"
	ldmDuration := testutil.EnvInt(t, "COMPASS_STORM_LAME_DUCK_S", 30)
	ldmGrace := testutil.EnvInt(t, "COMPASS_STORM_LAME_DUCK_GRACE_S", 10)
	if lameDuck && nodes < 2 {
		t.Fatal("COMPASS_STORM_LAME_DUCK=1: a lame duck hands its clients to other nodes; set COMPASS_STORM_NODES=3")
	}
	if lameDuck {
		t.Setenv("COMPASS_STORM_SERVER_CONF", os.Getenv("COMPASS_STORM_SERVER_CONF")+
			fmt.Sprintf("\nlame_duck_duration: \"%ds\"\nlame_duck_grace_period: \"%ds\"\n", ldmDuration, ldmGrace))
	}
	if conns < nodes {
		// Every node then has a callout subscriber of its own, so no
		// request waits for interest to cross a route.
		t.Fatalf("COMPASS_LOAD_CALLOUT_CONNS=%d: want at least one per node (%d)", conns, nodes)
	}

	w := newWorld(t, n)
	var mu sync.Mutex
	outcomes := map[string]int{}
	slack := &latencies{} // time left before the request's exp at each authorization
	age := &latencies{}   // time from a request's arrival at the callout to its answer
	// Answers published past the callout's answer horizon: past the client's
	// first PING, most likely wasted (compass_callout_answers_past_horizon_total).
	var pastHorizon atomic.Int64
	count := func(ev callout.Event) {
		k := string(ev.Outcome)
		if ev.Outcome == callout.OutcomeDropped {
			k += "/" + ev.Reason
		}
		if ev.Outcome == callout.OutcomeAuthorized {
			slack.add(ev.Slack)
			age.add(ev.Age)
		}
		if ev.PastHorizon {
			pastHorizon.Add(1)
		}
		mu.Lock()
		outcomes[k]++
		mu.Unlock()
	}
	signer, xkey := natsembed.Keys(t)
	sn := startStormNATS(t, nodes, authTimeout, signer, xkey)
	calloutReconnects, responder := startStormCallout(t, w, sn, signer, xkey, conns, workers, count)

	// cut marks the Runners the storm cuts; it is set before the storm and
	// read by the handlers after.
	cut := make([]atomic.Bool, n)
	var cutCount atomic.Int64
	// deadAddr is where n0 listens: after its death (and, alone, until it
	// is restarted), dials to it fail.
	deadAddr := strings.TrimPrefix(sn.nodes[0].URL, "nats://")
	var deadDials atomic.Int64
	var authErrs, otherErrs, reconnects, reconnectEvents, disconnects, bystanders, closed atomic.Int64
	back := make([]atomic.Bool, n)
	allBack := make(chan struct{})
	var storming atomic.Bool
	clients := make([]*nats.Conn, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	connectStart := time.Now()
	var connectFails atomic.Int64
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				tok := w.tokenAt(i)
				nc, err := nats.Connect("", sn.servers(i),
					nats.TokenHandler(func() string { return tok }),
					// A CONNECT waits for the callout up to the server's auth timeout.
					nats.Timeout(time.Duration(authTimeout+5)*time.Second),
					nats.MaxReconnects(-1),
					nats.CustomReconnectDelay(runner.ReconnectDelay(wait, jitter, maxJitter)),
					nats.IgnoreAuthErrorAbort(),
					nats.ReconnectBufSize(-1),
					nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
						if isAuthErr(err) {
							authErrs.Add(1)
						}
					}),
					// A refused reconnect is reported here, not to ErrorHandler;
					// so is a dial that failed, which only the killed node
					// may cause (dead, or not yet restarted).
					nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
						var op *net.OpError
						switch {
						case isAuthErr(err):
							authErrs.Add(1)
						case errors.As(err, &op) && op.Addr != nil && op.Addr.String() == deadAddr:
							deadDials.Add(1)
						default:
							otherErrs.Add(1)
						}
					}),
					nats.ReconnectHandler(func(*nats.Conn) {
						reconnectEvents.Add(1)
						// Count each cut Runner once, however often it reconnects.
						if cut[i].Load() && back[i].CompareAndSwap(false, true) && reconnects.Add(1) == cutCount.Load() {
							close(allBack)
						}
					}),
					nats.DisconnectErrHandler(func(*nats.Conn, error) {
						disconnects.Add(1)
						if storming.Load() && !cut[i].Load() {
							bystanders.Add(1)
						}
					}),
					nats.ClosedHandler(func(*nats.Conn) { closed.Add(1) }),
				)
				if err != nil {
					if connectFails.Add(1) <= 5 {
						t.Logf("initial connect %d: %v", i, err)
					}
					continue
				}
				clients[i] = nc
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, nc := range clients {
			if nc != nil {
				nc.Close()
			}
		}
	})
	mu.Lock()
	t.Logf("%d Runners connected to %d node(s) in %v (%d failed); callout %v", n, nodes, time.Since(connectStart).Round(time.Millisecond), connectFails.Load(), outcomes)
	mu.Unlock()
	if connectFails.Load() > 0 {
		t.Fatalf("%d initial connects failed", connectFails.Load())
	}
	perNode := make([]int, nodes)
	for i, nc := range clients {
		k := sn.node(nc.ConnectedServerId())
		if k < 0 {
			t.Fatalf("Runner %d is on server %q, none of the storm's", i, nc.ConnectedServerId())
		}
		perNode[k]++
		if nodes == 1 || k == 0 {
			cut[i].Store(true)
			cutCount.Add(1)
		}
	}
	t.Logf("Runners per node: %v", perNode)

	mu.Lock()
	clear(outcomes)
	mu.Unlock()
	cpu := newCPUSplit(sn)
	lag := &latencies{}
	lagCtx, stopLag := context.WithCancel(t.Context())
	defer stopLag()
	go laneLag(lagCtx, responder, 250*time.Millisecond, lag)
	storming.Store(true)
	stormStart := time.Now()
	if nodes == 1 {
		// The storm: the server dies with every Runner and the callout's
		// connections, and starts again on its ports.
		sn.restart(0)
		t.Logf("restarted n0 in %v", time.Since(stormStart).Round(time.Millisecond))
	} else if lameDuck {
		// The storm, as a rolling restart makes it: n0 enters lame duck mode
		// (what the preStop hook's nats-server --signal ldm sends), stops
		// accepting clients, and closes its Runners and its share of the
		// callout spread over lame_duck_duration, then exits.
		if err := syscall.Kill(sn.nodes[0].PID(), syscall.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		t.Logf("n0 in lame duck mode (%d s, grace %d s) with %d Runners on it", ldmDuration, ldmGrace, cutCount.Load())
	} else {
		// The storm: n0 dies with its Runners and its share of the callout.
		sn.nodes[0].Kill()
		t.Logf("killed n0 with %d Runners on it", cutCount.Load())
	}
	// Progress every 5 s, for whoever watches a long storm.
	progress := time.NewTicker(5 * time.Second)
	defer progress.Stop()
	timeout := time.After(deadline)
wait:
	for {
		select {
		case <-allBack:
			break wait
		case <-timeout:
			break wait
		case <-progress.C:
			mu.Lock()
			t.Logf("  %v: %d back, %d authorization errors, %d other reconnect errors, callout %v, answers' slack p10/50/90 %s and age %s, %d answers past the horizon; callout lanes' lag %s; CPU %s",
				time.Since(stormStart).Round(time.Second), reconnects.Load(), authErrs.Load(), otherErrs.Load(), outcomes, slack.spread(), age.spread(), pastHorizon.Load(), lag.spread(), cpu.take())
			mu.Unlock()
		}
	}
	took := time.Since(stormStart)
	mu.Lock()
	wasted := outcomes[string(callout.OutcomeAuthorized)] - int(reconnects.Load())
	decisions := fmt.Sprint(outcomes)
	mu.Unlock()
	t.Logf("storm: %d of %d cut Runners back in %v (%d Runners, %d node(s)); %d authorization errors and %d other reconnect errors seen by clients; %d closed; %d disconnects and %d reconnects in all; %d callout reconnects; callout decisions %s",
		reconnects.Load(), cutCount.Load(), took.Round(time.Millisecond), n, nodes, authErrs.Load(), otherErrs.Load(), closed.Load(), disconnects.Load(), reconnectEvents.Load(), calloutReconnects.Load(), decisions)
	hits, misses := w.verifier.CacheStats()
	t.Logf("storm: %d authorizations came too late for their client; %d answers were published past the callout's answer horizon; %d Runners of surviving nodes disconnected; %d dials to n0 failed (refused while it was down, or timed out); verified-token cache %d hits, %d misses since the start",
		max(wasted, 0), pastHorizon.Load(), bystanders.Load(), deadDials.Load(), hits, misses)
	if out := os.Getenv("COMPASS_LOAD_OUT"); out != "" {
		how := "killed"
		if lameDuck {
			how = fmt.Sprintf("lame duck %d s", ldmDuration)
		}
		row := fmt.Sprintf("| %d | %d | %s | %d of %d | %.1f s | %d | %d | %d | %s |\n", nodes, n, how, reconnects.Load(), cutCount.Load(), took.Seconds(), max(wasted, 0), pastHorizon.Load(), bystanders.Load(), strings.TrimSuffix(strings.TrimPrefix(decisions, "map["), "]"))
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteString(row)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if reconnects.Load() != cutCount.Load() {
		t.Errorf("%d cut Runners did not reconnect within %v", cutCount.Load()-reconnects.Load(), deadline)
	}
	if authErrs.Load() != 0 || otherErrs.Load() != 0 || closed.Load() != 0 {
		t.Errorf("storm failures: %d authorization errors, %d other reconnect errors, %d closed connections", authErrs.Load(), otherErrs.Load(), closed.Load())
	}
	if bystanders.Load() != 0 {
		t.Errorf("%d Runners of surviving nodes disconnected", bystanders.Load())
	}
}
