//go:build linux

// Package fleet measures compass-callout's kicker at fleet size (issue 35,
// item 1). It runs only when COMPASS_FLEET=1, so `go test ./...` stays fast:
//
//	COMPASS_FLEET=1 COMPASS_TEST_NATS_SERVER=/path/to/nats-server \
//	  go test -run TestFleet -v -timeout 60m ./test/fleet/
//
// For each size in COMPASS_FLEET_SIZES (default 1000,3000,10000) it starts
// three real nats-server processes (a routed cluster on 127.0.0.1, .2 and
// .3, server-config auth callout) and two compass-callout replicas
// (callout.Serve in this process, one on the first server and one on the
// second, sharing a SQLite store), then connects that many Runners at once
// from client processes (raw NATS protocol, one projected token each; see
// raw_test.go and child_test.go), spread evenly over the servers. It reports:
//
//   - the connect storm's time, from "go" to the last client process
//     having every connection up;
//   - one full sweep of the first replica (a changed cluster file applied,
//     from the reload signal to the sweep's end), as the median wall time
//     of COMPASS_FLEET_SWEEPS sweeps, and the CPU per sweep of this process
//     (the callouts) and of each nats-server; and the payload bytes one
//     full listing delivers to the kick identity's connection (nats.Conn
//     InBytes of a probe kicker's sweeps: see listingBytes);
//   - revocation latency, p50 and p99 of COMPASS_FLEET_REPS victims each,
//     from the change to the victim's raw connection seeing EOF, with the
//     whole fleet connected as bystanders: a node denied (both replicas'
//     cluster files edited and reloaded), a minted token revoked in the
//     store (picked up by the 1 s poll), and a duplicate (a second
//     connection with a copy of the victim's token; the duplicate grace is
//     kick.MinDuplicateGrace, 1 s, and is part of the figure);
//   - this process's VmRSS (both callouts, plus the harness's tokens);
//   - the steady state of token rotation (rotation_test.go): the CPU of
//     this process and of each nats-server over a quiet window and over a
//     window of COMPASS_FLEET_ROTATION_WINDOW seconds (30; 0 skips it) in
//     which Runners hand over to a new token at the rate the whole fleet
//     does, n / 480 s a second. COMPASS_FLEET_NO_KICK=1 runs the callouts
//     with --no-kick and measures that alone: the baseline of the kicker's
//     share.
//
// The periodic safety-net sweep is set to an hour (COMPASS_FLEET_SWEEP_INTERVAL)
// and the cluster file poll off, so that a measured sweep runs alone;
// COMPASS_FLEET_LIST_EVERY_SWEEP=1 has every sweep list the servers instead
// of judging the events' index (DL-468), the baseline of that. No bystander may be kicked.
package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
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

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

func gate(t *testing.T) {
	t.Helper()
	if os.Getenv("COMPASS_FLEET") != "1" {
		t.Skip("fleet harness: set COMPASS_FLEET=1 to run (see the package comment)")
	}
}

func sizes(t *testing.T) []int {
	t.Helper()
	v := os.Getenv("COMPASS_FLEET_SIZES")
	if v == "" {
		return []int{1000, 3000, 10000}
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			t.Fatalf("COMPASS_FLEET_SIZES=%q: want positive integers separated by commas", v)
		}
		out = append(out, n)
	}
	return out
}

// Limits of the harness, each with its reason.
const (
	// waitTimeout bounds every wait that is not a storm or a settle: a
	// process start, a sweep, a revocation (the bound is 2 s).
	waitTimeout = 60 * time.Second
	// stormTimeout bounds a connect storm; at 2 cores the callouts verify a
	// few thousand tokens a second.
	stormTimeout = 20 * time.Minute
	// settleQuiet: the fleet is settled once no replica's kicker has logged
	// for this long (the storm's duplicate checks done).
	settleQuiet = 2 * time.Second
	// tokenLifetime and userLifetime outlast a run of one size (the
	// cluster file allows tokenLifetime: the default bound is 600 s).
	tokenLifetime = 2 * time.Hour
	userLifetime  = callout.MaxMaxLifetime
	servers       = 3
	replicas      = 2
)

func TestFleet(t *testing.T) {
	gate(t)
	natsembed.Binary(t)
	if err := raiseFileLimit(16_000); err != nil {
		t.Fatal(err)
	}
	sz := sizes(t)
	perChild := testutil.EnvInt(t, "COMPASS_FLEET_PER_CHILD", 2500)
	if perChild > 15_000 {
		t.Fatalf("COMPASS_FLEET_PER_CHILD=%d: at most 15000 connections per process", perChild)
	}
	conc := testutil.EnvInt(t, "COMPASS_FLEET_CONCURRENCY", 16)
	reps := testutil.EnvInt(t, "COMPASS_FLEET_REPS", 5)
	sweeps := testutil.EnvInt(t, "COMPASS_FLEET_SWEEPS", 3)
	rotWindow := time.Duration(testutil.EnvInt(t, "COMPASS_FLEET_ROTATION_WINDOW", 30)) * time.Second
	// COMPASS_FLEET_NO_KICK=1 runs the callouts with --no-kick: the
	// rotation's cost without any kicker, the baseline of the kicker's
	// share; the sweeps and revocations are not measured then.
	noKick := testutil.EnvInt(t, "COMPASS_FLEET_NO_KICK", 0) == 1
	// COMPASS_FLEET_SWEEP_INTERVAL (seconds; 3600) is the replicas'
	// --sweep-interval: 30 measures the rotation with the safety net at its
	// default. COMPASS_FLEET_LIST_EVERY_SWEEP=1 has every sweep list the
	// servers (--list-interval 1ns), as before DL-468: the baseline of the
	// sweeps that judge the events' index.
	kn := knobs{
		noKick:        noKick,
		sweepInterval: time.Duration(testutil.EnvInt(t, "COMPASS_FLEET_SWEEP_INTERVAL", 3600)) * time.Second,
		listEvery:     testutil.EnvInt(t, "COMPASS_FLEET_LIST_EVERY_SWEEP", 0) == 1,
	}

	issuer, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = issuer.Close() })
	tokens := mintFleet(t, issuer, slices.Max(sz))

	var rows []row
	var rots []string
	for _, n := range sz {
		t.Run(fmt.Sprintf("%d", n), func(t *testing.T) {
			f := startFleet(t, issuer, kn)
			r := row{conns: n}
			f.storm(t, &r, tokens[:n], perChild, conc)
			f.settle(t)
			if !noKick {
				f.measureSweeps(t, &r, sweeps)
				r.deny = f.denyLatency(t, reps)
				r.revoke = f.revokeLatency(t, reps)
				r.dup = f.duplicateLatency(t, reps)
			}
			r.rss = vmRSS(t)
			var mib []string
			for _, b := range f.nodesRSS(t) {
				mib = append(mib, fmt.Sprintf("%d MiB", b>>20))
			}
			t.Logf("nats-servers' RSS with %d Runners connected (%d each): %s", n, n/servers, strings.Join(mib, " / "))
			if rotWindow > 0 {
				rot := f.rotationCost(t, n, rotWindow).String(n)
				t.Log(rotationHeader + rot)
				rots = append(rots, rot)
			}
			f.checkBystanders(t)
			t.Log(header + r.String())
			rows = append(rows, r)
		})
	}
	var b strings.Builder
	b.WriteString(header)
	for _, r := range rows {
		b.WriteString(r.String())
	}
	if len(rots) > 0 {
		b.WriteString("\n" + rotationHeader)
		for _, r := range rots {
			b.WriteString(r)
		}
	}
	t.Logf("\n%s", b.String())
	if out := os.Getenv("COMPASS_FLEET_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fleetRunner is one bystander: its token and command subject.
type fleetRunner struct{ token, subject string }

// mintFleet makes n projected tokens, one per node of cluster prod.
func mintFleet(t *testing.T, is *kubeissuer.Issuer, n int) []fleetRunner {
	t.Helper()
	out := make([]fleetRunner, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	var failed atomic.Value
	for range 2 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				node := fmt.Sprintf("node-%06d", i)
				tok, err := is.Token(kubeissuer.Pod{NodeName: node}, tokenLifetime)
				if err != nil {
					failed.Store(err)
					return
				}
				subj, err := subjects.Command(verifier.WorkloadRunnerID("prod", node))
				if err != nil {
					failed.Store(err)
					return
				}
				out[i] = fleetRunner{token: tok, subject: subj}
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		t.Fatalf("minting the fleet's tokens: %v", err)
	}
	return out
}

func commandSubject(t *testing.T, cluster, node string) string {
	t.Helper()
	s, err := subjects.Command(verifier.WorkloadRunnerID(cluster, node))
	if err != nil {
		t.Fatalf("command subject of %s/%s: %v", cluster, node, err)
	}
	return s
}

// fleet is one size's world: servers, callouts, store, client processes.
type fleet struct {
	dir      string
	issuer   *kubeissuer.Issuer
	caFile   string
	db       store.Store
	nodes    []*natsembed.Process
	addrs    []string // client host:port per node
	replicas []*replica
	children []*child
	deny     []string // denied nodes so far, in both replicas' files
	victims  atomic.Int64
}

type replica struct {
	name        string
	clusterFile string
	reload      chan os.Signal
	log         *capture
}

// knobs are how the replicas run, from the environment (TestFleet).
type knobs struct {
	noKick        bool
	sweepInterval time.Duration
	listEvery     bool
}

func startFleet(t *testing.T, is *kubeissuer.Issuer, kn knobs) *fleet {
	t.Helper()
	noKick := kn.noKick
	listInterval := time.Duration(0) // kick.DefaultListInterval
	if kn.listEvery {
		listInterval = time.Nanosecond
	}
	f := &fleet{dir: t.TempDir(), issuer: is}
	var err error
	if f.caFile, err = is.WriteCAFileIn(f.dir, "prod"); err != nil {
		t.Fatal(err)
	}
	dbURL := "sqlite://" + filepath.Join(f.dir, "compass.db")
	f.db = storetest.OpenCurrent(t, dbURL)
	seedFile := filepath.Join(f.dir, "issuer.nk")
	pub := natsembed.WriteIssuerSeed(t, seedFile)

	routePorts := testutil.FreePorts(t, servers)
	for i := range servers {
		var routes []string
		for j, p := range routePorts {
			if j != i {
				routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats://127.0.0.1:%d", p)))
			}
		}
		extra := fmt.Sprintf("server_name: n%d\nhttp: \"127.0.0.1:-1\"\ncluster { name: c, listen: \"127.0.0.1:%d\", routes: [ %s ] }",
			i, routePorts[i], strings.Join(routes, ", "))
		conf := natsembed.ForProcessConfig(pub, extra)
		// Each server on its own loopback address, as on three hosts.
		conf = strings.Replace(conf, `listen: "127.0.0.1:-1"`, fmt.Sprintf(`listen: "127.0.0.%d:-1"`, i+1), 1)
		p := natsembed.StartProcess(t, conf)
		f.nodes = append(f.nodes, p)
		f.addrs = append(f.addrs, strings.TrimPrefix(p.URL, "nats://"))
	}
	f.waitServers(t)

	kickUser, kickPassword := natsembed.KickUser, natsembed.KickPassword
	if noKick {
		kickUser, kickPassword = "", ""
	}
	for i := range replicas {
		r := &replica{
			name: replicaName(i), clusterFile: filepath.Join(f.dir, fmt.Sprintf("clusters-%d.yaml", i)),
			reload: make(chan os.Signal, 1), log: newCapture(calloutLog(t, replicaName(i))),
		}
		f.writeClusters(t, r, nil)
		f.replicas = append(f.replicas, r)
		ready := make(chan string, 1)
		done := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
		go func() {
			done <- callout.Serve(ctx, callout.ServeConfig{
				NATSURLs: f.nodes[i].URL, NATSUser: natsembed.CalloutUser, NATSPassword: natsembed.CalloutPassword,
				KickUser: kickUser, KickPassword: kickPassword, NoKick: noKick,
				Mode: callout.ModeServerConfig, IssuerSeedFile: seedFile, Account: natsembed.Account,
				RunnerClusters: r.clusterFile, DatabaseURL: dbURL, MaxUserLifetime: userLifetime,
				DuplicateGrace: kick.MinDuplicateGrace, SweepInterval: kn.sweepInterval, ListInterval: listInterval, ClusterFilePoll: time.Hour,
				Logger: slog.New(r.log), ReloadSignals: r.reload,
				Ready: func(a string) { ready <- a },
			})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: callout.Serve: %v", r.name, err)
			}
		})
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("%s: callout.Serve: %v", r.name, err)
		case <-time.After(waitTimeout):
			t.Fatalf("%s did not become ready within %s", r.name, waitTimeout)
		}
	}
	return f
}

func replicaName(i int) string { return fmt.Sprintf("callout-%d", i) }

// calloutLog is where a replica's own log goes besides the harness's
// capture: with COMPASS_FLEET_CALLOUT_LOGS=<dir>, <dir>/<name>.log at info
// and above (for diagnosis); else nowhere.
func calloutLog(t *testing.T, name string) slog.Handler {
	t.Helper()
	dir := os.Getenv("COMPASS_FLEET_CALLOUT_LOGS")
	if dir == "" {
		return nil
	}
	fh, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fh.Close() })
	return slog.NewTextHandler(fh, &slog.HandlerOptions{Level: slog.LevelInfo})
}

// waitServers waits until every server's monitoring endpoint reports a
// route to each other one: the cluster has formed.
func (f *fleet) waitServers(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for _, p := range f.nodes {
		for {
			var v struct {
				Routes int `json:"routes"`
			}
			err := getJSON(p.MonitorURL+"/varz", &v)
			if err == nil && v.Routes >= servers-1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not formed within %s: %s has %d routes (%v)", waitTimeout, p.URL, v.Routes, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// writeClusters writes r's cluster file: prod, denying the named nodes.
func (f *fleet) writeClusters(t *testing.T, r *replica, deny []string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "clusters:\n  - name: prod\n    issuer: %s\n    caFile: %s\n    maxTokenLifetime: %s\n", f.issuer.URL(), f.caFile, tokenLifetime)
	if len(deny) > 0 {
		fmt.Fprintf(&b, "    deny:\n      nodes: [%s]\n", strings.Join(deny, ", "))
	}
	if err := os.WriteFile(r.clusterFile, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// storm starts the client processes, then has them all connect at once.
func (f *fleet) storm(t *testing.T, r *row, fleet []fleetRunner, perChild, conc int) {
	t.Helper()
	nChildren := (len(fleet) + perChild - 1) / perChild
	specs := make([]spec, nChildren)
	for i := range specs {
		// Each process dials from its own loopback address, so no address
		// runs out of ephemeral ports at larger sizes.
		specs[i] = spec{Source: fmt.Sprintf("127.0.0.%d", 10+i), Concurrency: conc}
	}
	for i, fr := range fleet {
		c := &specs[i%nChildren]
		c.Conns = append(c.Conns, specConn{Addr: f.addrs[i%servers], Token: fr.token, Subject: fr.subject})
	}
	for i, sp := range specs {
		f.children = append(f.children, startChild(t, f.dir, i, sp))
	}
	start := time.Now()
	for i, ch := range f.children {
		if _, err := ch.stdin.Write([]byte("go\n")); err != nil {
			t.Fatalf("client process %d: %v", i, err)
		}
	}
	deadline := time.After(stormTimeout)
	for i, ch := range f.children {
		select {
		case res := <-ch.connected:
			r.connected += res[0]
			r.retries += res[1]
			if res[2] > 0 {
				t.Errorf("client process %d: %d connections failed after %d attempts each", i, res[2], connectAttempts)
			}
		case <-ch.exited:
			t.Fatalf("client process %d exited during the storm:\n%s", i, ch.stderr.String())
		case <-deadline:
			t.Fatalf("connect storm not done within %s", stormTimeout)
		}
	}
	r.storm = time.Since(start)
	r.children = nChildren
}

// settle waits until both kickers have been quiet for settleQuiet: the
// storm's duplicate checks are done.
func (f *fleet) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(stormTimeout)
	for {
		quiet := true
		for _, r := range f.replicas {
			if time.Since(r.log.lastKick()) < settleQuiet {
				quiet = false
			}
		}
		if quiet {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kickers did not settle within %s after the storm", stormTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// measureSweeps has the first replica sweep n times, each on a changed
// cluster file (a node that runs no Runner denied, then allowed again).
func (f *fleet) measureSweeps(t *testing.T, r *row, n int) {
	t.Helper()
	rep := f.replicas[0]
	var walls []time.Duration
	var cpu time.Duration
	nodeCPU := make([]time.Duration, servers)
	for i := range n {
		deny := slices.Clone(f.deny)
		if i%2 == 0 {
			deny = append(deny, "no-such-node")
		}
		f.writeClusters(t, rep, deny)
		rep.log.drainSweeps()
		c0 := cpuSelf()
		n0 := f.nodesCPU(t)
		start := time.Now()
		rep.reload <- syscall.SIGHUP
		end := rep.log.awaitSweep(t, "cluster_file")
		walls = append(walls, end.at.Sub(start))
		r.listed = append(r.listed, fmt.Sprintf("%d (%d)", end.runners, end.servers))
		if end.servers != servers {
			// Not a harness failure: the figure to report. A listing ends
			// kick's gatherQuiet after the last answer, so a server slower
			// than that to answer is not in the sweep.
			t.Logf("sweep %d of %s heard %d of %d servers (%d Runner connections)", i, rep.name, end.servers, servers, end.runners)
		}
		cpu += cpuSelf() - c0
		for j, c := range f.nodesCPU(t) {
			nodeCPU[j] += c - n0[j]
		}
	}
	r.sweepBytes, r.sweepMsgs = f.listingBytes(t, n, r.connected)
	slices.Sort(walls)
	r.sweepWall = walls[len(walls)/2]
	r.sweepCPU = cpu / time.Duration(n)
	for j := range nodeCPU {
		r.nodeCPU = append(r.nodeCPU, nodeCPU[j]/time.Duration(n))
	}
	// Leave both replicas' files alike.
	f.writeClusters(t, rep, f.deny)
}

// victim connects one Runner from this process to node i%3 and returns a
// channel that receives the time the server closed its connection.
func (f *fleet) victim(t *testing.T, token, subject string) (*rawConn, chan time.Time) {
	t.Helper()
	i := int(f.victims.Add(1))
	rc, err := dialRunner(&netDialer, f.addrs[i%servers], token, subject)
	if err != nil {
		t.Fatalf("victim connect: %v", err)
	}
	closed := make(chan time.Time, 1)
	go func() {
		if err := rc.serve(); closedByServer(err) {
			closed <- time.Now()
		}
	}()
	t.Cleanup(rc.close)
	return rc, closed
}

func awaitClosed(t *testing.T, what string, closed chan time.Time, since time.Time) time.Duration {
	t.Helper()
	select {
	case at := <-closed:
		return at.Sub(since)
	case <-time.After(waitTimeout):
		t.Fatalf("%s: the victim's connection was still open %s after the change", what, waitTimeout)
	}
	return 0
}

func (f *fleet) denyLatency(t *testing.T, n int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range n {
		node := fmt.Sprintf("victim-deny-%d", i)
		tok, err := f.issuer.Token(kubeissuer.Pod{NodeName: node}, tokenLifetime)
		if err != nil {
			t.Fatal(err)
		}
		_, closed := f.victim(t, tok, commandSubject(t, "prod", node))
		f.deny = append(f.deny, node)
		for _, r := range f.replicas {
			f.writeClusters(t, r, f.deny)
		}
		start := time.Now()
		for _, r := range f.replicas {
			r.reload <- syscall.SIGHUP
		}
		out = append(out, awaitClosed(t, "node deny "+node, closed, start))
	}
	return out
}

func (f *fleet) revokeLatency(t *testing.T, n int) []time.Duration {
	t.Helper()
	ctx := t.Context()
	var out []time.Duration
	for i := range n {
		id := fmt.Sprintf("victim-minted-%d", i)
		tok, info, err := f.db.Mint(ctx, verifier.SubjectRunner, id)
		if err != nil {
			t.Fatal(err)
		}
		subj, err := subjects.Command(id)
		if err != nil {
			t.Fatal(err)
		}
		_, closed := f.victim(t, tok, subj)
		// Revoke at a random point of the callouts' 1 s store poll: the
		// previous victim's end is in step with the poll, and revoking at
		// once would measure the same phase every time. Not a wait for
		// anything.
		time.Sleep(rand.N(callout.DefaultRevocationPoll))
		if _, err := f.db.Revoke(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
		out = append(out, awaitClosed(t, "revoke-token "+id, closed, time.Now()))
	}
	return out
}

func (f *fleet) duplicateLatency(t *testing.T, n int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range n {
		node := fmt.Sprintf("victim-dup-%d", i)
		tok, err := f.issuer.Token(kubeissuer.Pod{NodeName: node}, tokenLifetime)
		if err != nil {
			t.Fatal(err)
		}
		subj := commandSubject(t, "prod", node)
		_, closed := f.victim(t, tok, subj)
		cp, _ := f.victim(t, tok, subj) // the copy: newest wins
		out = append(out, awaitClosed(t, "duplicate "+node, closed, time.Now()))
		cp.close()
	}
	return out
}

// checkBystanders fails the test if any bystander was kicked.
func (f *fleet) checkBystanders(t *testing.T) {
	t.Helper()
	for i, ch := range f.children {
		if n := ch.lost.Load(); n > 0 {
			t.Errorf("client process %d: %d bystanders lost their connection", i, n)
		}
	}
}
