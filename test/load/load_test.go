// Package load is the CONNECT load harness of compass-callout. It
// runs only when COMPASS_LOAD=1, so `go test ./...` stays fast:
//
//	COMPASS_LOAD=1 go test -run TestConnectLoad -v -timeout 30m ./test/load/
//	COMPASS_LOAD=1 go test -run TestReconnectStorm -v -timeout 30m ./test/load/
//
// TestConnectLoad runs everything in this one process on loopback: an
// embedded nats-server per scenario, the responders, the test issuer and the
// clients. Scenarios are measured in interleaved rounds and the median round
// is reported, with each cell's rate as a ratio to the plain-token ceiling of
// the same round. TestReconnectStorm runs its servers as real nats-server
// processes (COMPASS_TEST_NATS_SERVER; see storm_test.go).
package load

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

func gate(t *testing.T) {
	t.Helper()
	if os.Getenv("COMPASS_LOAD") != "1" {
		t.Skip("load harness: set COMPASS_LOAD=1 to run (see docs/performance.md)")
	}
}

// Limits of the harness, each with its reason.
const (
	// connectTimeout is a client's whole CONNECT budget; a connect slower than
	// this is a failure, not a data point.
	connectTimeout = 10 * time.Second
	// tokenLifetime must outlast a whole run (tokens are made once).
	tokenLifetime = 600 * time.Second
)

// world is the shared part: issuer, verifier, tokens.
type world struct {
	issuer   *kubeissuer.Issuer
	verifier *verifier.RunnerVerifier
	resolver *verifier.Resolver
	tokens   []string // distinct projected tokens, one per Runner
	dir      string
}

func newWorld(t *testing.T, n int) *world {
	t.Helper()
	w := &world{dir: t.TempDir()}
	var err error
	if w.issuer, err = kubeissuer.New(kubeissuer.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.issuer.Close() })
	// The verified-token cache is on, as in the daemons, unless
	// COMPASS_LOAD_VERIFIED_CACHE=off.
	var opts []verifier.Option
	switch c := os.Getenv("COMPASS_LOAD_VERIFIED_CACHE"); c {
	case "", "on":
	case "off":
		opts = append(opts, verifier.WithVerifiedCache(0))
	default:
		t.Fatalf("COMPASS_LOAD_VERIFIED_CACHE=%q: want on or off", c)
	}
	v := verifiertest.New(t, "t", []verifier.RunnerCluster{verifiertest.Cluster(t, w.issuer, "prod")}, opts...)
	w.verifier = v
	w.resolver = verifier.NewResolver(v, nil)
	w.tokens = make([]string, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 2 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				tok, err := w.issuer.Token(kubeissuer.Pod{NodeName: fmt.Sprintf("node-%05d.compute.internal", i)}, tokenLifetime)
				if err != nil {
					panic(err)
				}
				w.tokens[i] = tok
			}
		})
	}
	wg.Wait()
	return w
}

// scenario is one way of authenticating a CONNECT.
type scenario struct {
	name  string
	srv   *server.Server
	token func(i int) string
	stop  func()
	// answers records how long the responder took per request (nil for
	// the ceiling): the responder's share of a CONNECT's latency.
	answers *latencies
}

// latencies collects durations from responder goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// spread returns the 10th, 50th and 90th percentiles so far, as
// "p10/p50/p90", and starts over.
func (l *latencies) spread() string {
	l.mu.Lock()
	d := l.d
	l.d = nil
	l.mu.Unlock()
	if len(d) == 0 {
		return "–"
	}
	slices.Sort(d)
	q := func(p int) time.Duration { return d[len(d)*p/100].Round(time.Millisecond) }
	return fmt.Sprintf("%v/%v/%v", q(10), q(50), q(90))
}

// take returns the median so far and starts over.
func (l *latencies) take() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	d := l.d
	l.d = nil
	l.mu.Unlock()
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}

func startServer(t *testing.T, name, conf string) *server.Server {
	t.Helper()
	return natsembed.Serve(t, conf, func(opts *server.Options) {
		if dir := os.Getenv("COMPASS_LOAD_SERVER_LOGS"); dir != "" {
			// For diagnosis: the server's own account of each CONNECT.
			opts.NoLog, opts.Debug, opts.LogFile = false, true, filepath.Join(dir, name+".log")
		}
	})
}

// calloutConf is a harness server's configuration: head (its name and
// ports), the callout's account and user, the Runners' account, a system
// account, the auth callout (its timeout, issuer and xline, the xkey line
// when requests are sealed), then tail (a cluster block). The in-process
// scenarios and the storm share it, so both measure one server setup.
func calloutConf(head, user, password string, authTimeout int, issuer, xline, tail string) string {
	return fmt.Sprintf(`
%s
accounts {
  CALLOUT { users: [ { user: %s, password: %s } ] }
  RUNNERS {}
  SYS {}
}
system_account: SYS
authorization {
  timeout: %d
  auth_callout {
    issuer: %s
    account: CALLOUT
    auth_users: [ %s ]
    %s
  }
}
%s
`, head, user, password, authTimeout, issuer, user, xline, tail)
}

// inProcessListen is the in-process scenarios' server head: a random
// loopback port, no monitoring.
const inProcessListen = `listen: "127.0.0.1:-1"`

// tokenScenario: plain token authorization, no callout. The ceiling.
func tokenScenario(t *testing.T, w *world) *scenario {
	const tok = "s3cr3t-shared-token-for-the-ceiling-measurement"
	srv := startServer(t, "token", `
listen: "127.0.0.1:-1"
authorization { token: "`+tok+`" }
`)
	return &scenario{name: "plain token (ceiling)", srv: srv, token: func(int) string { return tok }, stop: func() {}}
}

// naiveScenario: a responder written the obvious way, answering a fixed user
// JWT without verifying anything: one connection, one subscription, nkeys'
// key pair (re-derived on every sign), serial.
func naiveScenario(t *testing.T, w *world) *scenario {
	signer, _ := natsembed.Keys(t)
	seed, _ := signer.Seed()
	kp, _ := nkeys.FromSeed(seed)
	srv := startServer(t, "naive", calloutConf(inProcessListen, "callout", "pwd", defaultAuthTimeout, signer.Public(), "", ""))
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("callout", "pwd"))
	if err != nil {
		t.Fatal(err)
	}
	perms, _ := callout.RunnerPermissions(noopRunnerID)
	answers := &latencies{}
	_, err = nc.Subscribe(callout.Subject, func(m *nats.Msg) {
		start := time.Now()
		defer func() { answers.add(time.Since(start)) }()
		rc, err := jwt.DecodeAuthorizationRequestClaims(string(m.Data))
		if err != nil {
			return
		}
		uc := jwt.NewUserClaims(rc.UserNkey)
		uc.Name = noopRunnerID
		uc.Audience = "RUNNERS"
		uc.Expires = time.Now().Add(10 * time.Minute).Unix()
		uc.Permissions = perms
		ujwt, err := uc.Encode(kp)
		if err != nil {
			return
		}
		resp := jwt.NewAuthorizationResponseClaims(rc.UserNkey)
		resp.Audience = rc.Server.ID
		resp.Jwt = ujwt
		out, err := resp.Encode(kp)
		if err != nil {
			return
		}
		_ = m.Respond([]byte(out))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &scenario{name: "no-op, obvious responder", srv: srv, token: w.tokenAt, stop: nc.Close, answers: answers}
}

func (w *world) tokenAt(i int) string { return w.tokens[i%len(w.tokens)] }

// forget empties the verified-token cache before a cell: a key-set load
// drops every entry. Within a cell every connect presents its own token, so
// each one is verified in full, as the first connect of a Runner is; the
// cells measure verification, not the cache (the reconnect storm does).
func (w *world) forget(t *testing.T) {
	t.Helper()
	if err := w.verifier.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// noopRunnerID is the Runner the no-op responders answer for: as long as
// every real Runner ID in the harness (node names node-NNNNN.compute.internal
// in cluster prod), so user JWTs and answers are the same size in every
// scenario and the difference between them is the verification alone.
const noopRunnerID = "prod/node-00000_compute_internal"

// fixedResolver answers every token with the same Runner: the no-op floor of
// the compass responder (same connections, workers, signer and xkey).
type fixedResolver struct{}

func (fixedResolver) Resolve(context.Context, string, verifier.SubjectKind) (verifier.Subject, error) {
	return verifier.Subject{Kind: verifier.SubjectRunner, ID: noopRunnerID}, nil
}

// compassScenario runs callout.Responder with the given resolver.
func compassScenario(t *testing.T, w *world, name string, res callout.Resolver, sealed bool, conns, workers int) *scenario {
	return compassScenarioWith(t, w, name, res, sealed, conns, workers, defaultAuthTimeout, nil)
}

// defaultAuthTimeout is nats-server's own default, in seconds.
const defaultAuthTimeout = 2

func compassScenarioWith(t *testing.T, w *world, name string, res callout.Resolver, sealed bool, conns, workers, authTimeout int, observe func(callout.Event)) *scenario {
	signer, x := natsembed.Keys(t)
	answers := &latencies{}
	if observe == nil {
		observe = func(callout.Event) {}
	}
	record := func(ev callout.Event) {
		answers.add(ev.Latency)
		observe(ev)
	}
	var xkey *callout.XKey
	xline := ""
	if sealed {
		xkey = x
		xline = "xkey: " + xkey.Public()
	}
	srv := startServer(t, strings.ReplaceAll(name, " ", "-"), calloutConf(inProcessListen, "callout", "pwd", authTimeout, signer.Public(), xline, ""))
	r, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: res, ResponseSigner: signer, Account: "RUNNERS",
		XKey: xkey, Workers: workers, Observe: record,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		t.Fatal(err)
	}
	natsembed.StartResponder(t, r, dialN(t, conns, func(int) (*nats.Conn, error) {
		return nats.Connect(srv.ClientURL(), nats.UserInfo("callout", "pwd"), nats.Name("compass-callout"))
	})...)
	return &scenario{name: name, srv: srv, token: w.tokenAt, stop: func() {}, answers: answers}
}

// dialN makes the callout's n connections with dial; one that fails fails
// the test.
func dialN(t *testing.T, n int, dial func(i int) (*nats.Conn, error)) []*nats.Conn {
	t.Helper()
	ncs := make([]*nats.Conn, 0, n)
	for i := range n {
		nc, err := dial(i)
		if err != nil {
			t.Fatal(err)
		}
		ncs = append(ncs, nc)
	}
	return ncs
}

// cell is one measurement: n connects at a concurrency.
type cell struct {
	rate     float64 // connects per second
	p50, p99 time.Duration
	cpu      time.Duration // process CPU per connect
	answer   time.Duration // the responder's median time per request
	failures int
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure connects and closes n clients, conc at a time, each with its own
// token (offset into the pool so cells use different tokens).
func measure(s *scenario, n, conc, offset int) cell {
	lat := make([]time.Duration, n)
	var next, fails atomic.Int64
	url := s.srv.ClientURL()
	var wg sync.WaitGroup
	s.answers.take() // nothing from before this cell
	cpu0 := cpuNow()
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				t0 := time.Now()
				nc, err := nats.Connect(url, nats.Token(s.token(offset+i)), nats.NoReconnect(), nats.Timeout(connectTimeout))
				lat[i] = time.Since(t0)
				if err != nil {
					fails.Add(1)
					continue
				}
				nc.Close()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuNow() - cpu0
	answer := s.answers.take()
	slices.Sort(lat)
	return cell{
		rate:     float64(n) / elapsed.Seconds(),
		p50:      lat[n/2],
		p99:      lat[n*99/100],
		cpu:      cpu / time.Duration(n),
		answer:   answer,
		failures: int(fails.Load()),
	}
}

// TestConnectLoad measures CONNECT throughput and latency per scenario at
// concurrency 1 and 32, in interleaved rounds, and reports the median round.
func TestConnectLoad(t *testing.T) {
	gate(t)
	n := testutil.EnvInt(t, "COMPASS_LOAD_CONNECTS", 3000)
	rounds := testutil.EnvInt(t, "COMPASS_LOAD_ROUNDS", 3)
	conns := testutil.EnvInt(t, "COMPASS_LOAD_CALLOUT_CONNS", 4)
	workers := testutil.EnvInt(t, "COMPASS_LOAD_CALLOUT_WORKERS", 8)
	concs := []int{1, 32}
	if only := os.Getenv("COMPASS_LOAD_ONLY_C"); only != "" {
		// For profiling one concurrency (with COMPASS_LOAD_ONLY).
		c, err := strconv.Atoi(only)
		if err != nil || c < 1 {
			t.Fatalf("COMPASS_LOAD_ONLY_C=%q: want a concurrency of at least 1", only)
		}
		concs = []int{c}
	}

	w := newWorld(t, n*len(concs))
	scenarios := []*scenario{
		tokenScenario(t, w),
		naiveScenario(t, w),
		compassScenario(t, w, "no-op, compass responder", fixedResolver{}, false, conns, workers),
		compassScenario(t, w, "compass-callout, full verification", w.resolver, false, conns, workers),
		compassScenario(t, w, "no-op, compass responder, xkey", fixedResolver{}, true, conns, workers),
		compassScenario(t, w, "compass-callout, full verification, xkey", w.resolver, true, conns, workers),
	}
	if only := os.Getenv("COMPASS_LOAD_ONLY"); only != "" {
		// For profiling one scenario; the ratios below then need the ceiling first.
		// A trailing "$" asks for the scenario of exactly that name.
		exact, isExact := strings.CutSuffix(only, "$")
		var names []string
		for _, s := range scenarios {
			names = append(names, fmt.Sprintf("%q", s.name))
		}
		scenarios = slices.DeleteFunc(scenarios, func(s *scenario) bool {
			if isExact {
				return s.name != exact
			}
			return !strings.Contains(s.name, only)
		})
		if len(scenarios) == 0 {
			t.Fatalf("COMPASS_LOAD_ONLY=%q matches no scenario; they are %s", only, strings.Join(names, ", "))
		}
		for _, s := range scenarios {
			for ci, conc := range concs {
				w.forget(t)
				c := measure(s, n, conc, ci*n)
				t.Logf("c=%d %-42s %7.0f/s p50 %v p99 %v cpu/connect %v responder p50 %v failures %d", conc, s.name, c.rate, c.p50, c.p99, c.cpu, c.answer, c.failures)
			}
		}
		return
	}
	// results[scenario][conc] = one cell per round
	results := make([][][]cell, len(scenarios))
	for i := range results {
		results[i] = make([][]cell, len(concs))
	}
	for r := range rounds {
		// Every other round runs the scenarios in reverse, so that no
		// scenario always follows the same one (whatever the previous cell
		// leaves behind: a grown heap, a busier or idler CPU).
		order := make([]int, len(scenarios))
		for i := range order {
			order[i] = i
			if r%2 == 1 {
				order[i] = len(scenarios) - 1 - i
			}
		}
		for ci, conc := range concs {
			for _, si := range order {
				s := scenarios[si]
				w.forget(t)
				hits, _ := w.verifier.CacheStats()
				c := measure(s, n, conc, ci*n)
				if h, _ := w.verifier.CacheStats(); h != hits {
					t.Errorf("%s at concurrency %d: %d connects answered from the verified-token cache; every connect must be verified in full", s.name, conc, h-hits)
				}
				results[si][ci] = append(results[si][ci], c)
				t.Logf("round %d c=%d %-42s %7.0f/s p50 %v p99 %v cpu/connect %v responder p50 %v failures %d",
					r+1, conc, s.name, c.rate, c.p50.Round(time.Microsecond), c.p99.Round(time.Microsecond), c.cpu.Round(time.Microsecond), c.answer.Round(time.Microsecond), c.failures)
				if c.failures > 0 {
					t.Errorf("%s at concurrency %d: %d failed connects", s.name, conc, c.failures)
				}
			}
		}
	}
	// Ratios are taken per round against the same round's ceiling, then the
	// median is reported.
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d connects per cell, %d rounds, median round; callout: %d connections, %d workers\n\n", n, rounds, conns, workers)
	fmt.Fprintf(&b, "| scenario | c | connects/s | × ceiling | p50 | p99 | CPU/connect | responder p50 |\n|---|---|---|---|---|---|---|---|\n")
	medianRatio := func(si, ci, base int) float64 {
		var rs []float64
		for r := range rounds {
			rs = append(rs, results[si][ci][r].rate/results[base][ci][r].rate)
		}
		sort.Float64s(rs)
		return rs[len(rs)/2]
	}
	for ci, conc := range concs {
		for si, s := range scenarios {
			cs := slices.Clone(results[si][ci])
			slices.SortFunc(cs, func(a, b cell) int {
				switch {
				case a.rate < b.rate:
					return -1
				case a.rate > b.rate:
					return 1
				}
				return 0
			})
			m := cs[len(cs)/2]
			answer := "–"
			if m.answer > 0 {
				answer = m.answer.Round(time.Microsecond).String()
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f× | %v | %v | %v | %s |\n", s.name, conc, m.rate, medianRatio(si, ci, 0),
				m.p50.Round(10*time.Microsecond), m.p99.Round(10*time.Microsecond), m.cpu.Round(10*time.Microsecond), answer)
		}
	}
	// CPU per connect is the process's own CPU time, so it is much less
	// disturbed than the rate by other processes on a shared machine.
	medianCPURatio := func(si, ci, base int) float64 {
		var rs []float64
		for r := range rounds {
			rs = append(rs, float64(results[base][ci][r].cpu)/float64(results[si][ci][r].cpu))
		}
		sort.Float64s(rs)
		return rs[len(rs)/2]
	}
	fmt.Fprintf(&b, "\nCPU per connect, no-op ÷ full verification (1.00 = verification is free; median of per-round ratios):\n")
	for ci, conc := range concs {
		fmt.Fprintf(&b, "  c=%d: plain %.2f, xkey %.2f; token ceiling ÷ full verification %.2f, ÷ obvious no-op %.2f\n", conc,
			medianCPURatio(3, ci, 2), medianCPURatio(5, ci, 4), medianCPURatio(3, ci, 0), medianCPURatio(1, ci, 0))
	}
	fmt.Fprintf(&b, "\nfull verification ÷ no-op (same responder, median of per-round ratios):\n")
	for ci, conc := range concs {
		fmt.Fprintf(&b, "  c=%d: plain %.2f×, xkey %.2f×; vs the obvious no-op responder %.2f×\n", conc,
			medianRatio(3, ci, 2), medianRatio(5, ci, 4), medianRatio(3, ci, 1))
	}
	t.Log(b.String())
	if out := os.Getenv("COMPASS_LOAD_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The 0.9× target is reported, not asserted: the harness measures, and a
	// ratio on a shared machine is a figure for docs/performance.md, not a
	// pass/fail verdict.
	for ci, conc := range concs {
		for _, pair := range [][2]int{{3, 2}, {5, 4}} {
			r := medianRatio(pair[0], ci, pair[1])
			verdict := "meets"
			if r < 0.9 {
				verdict = "MISSES"
			}
			var rs []float64
			for rd := range rounds {
				rs = append(rs, results[pair[0]][ci][rd].rate/results[pair[1]][ci][rd].rate)
			}
			t.Logf("target: c=%d: %s at %.3f× of %s (rounds %.2f–%.2f) %s the 0.9× target",
				conc, scenarios[pair[0]].name, r, scenarios[pair[1]].name, slices.Min(rs), slices.Max(rs), verdict)
		}
		// Verification for free: full verification at least 1.0× the
		// obvious no-op responder, which verifies nothing.
		var rs []float64
		for rd := range rounds {
			rs = append(rs, results[3][ci][rd].rate/results[1][ci][rd].rate)
		}
		slices.Sort(rs)
		verdict := "meets"
		if medianRatio(3, ci, 1) < 1.0 {
			verdict = "MISSES"
		}
		t.Logf("target: c=%d: %s at %.3f× of %s (rounds %s) %s the 1.0× target",
			conc, scenarios[3].name, medianRatio(3, ci, 1), scenarios[1].name, joinRatios(rs), verdict)
	}
}

// joinRatios lists sorted per-round ratios, "0.88, 0.90, …".
func joinRatios(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(parts, ", ")
}
