//go:build linux

package fleet

// What the harness reads: the callouts' kick log lines, CPU times, the kick
// identity's bytes, memory; and the table it writes.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/test/natsembed"
)

// netDialer dials the victims, from this process's default address.
var netDialer = net.Dialer{Timeout: handshakeTimeout}

// capture is a replica's slog.Handler: it keeps when the kicker last logged
// and when each sweep ended ("kick: sweep", a debug line, with its
// trigger), and counts the kicker's warnings. It keeps no attribute but the
// trigger, so nothing it holds is a secret.
type capture struct {
	last   atomic.Int64 // unix nanoseconds of the last "kick: " line
	warns  atomic.Int64
	sweeps chan sweepEnd
	// tee, if set, also gets every record at its level or above (the
	// callout's own log, for diagnosis: COMPASS_FLEET_CALLOUT_LOGS).
	tee slog.Handler
}

type sweepEnd struct {
	trigger string
	at      time.Time
	// servers is how many servers answered the listing, runners how many
	// Runner connections it held.
	servers, runners int64
}

func newCapture(tee slog.Handler) *capture {
	c := &capture{sweeps: make(chan sweepEnd, 256), tee: tee}
	c.last.Store(time.Now().UnixNano())
	return c
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *capture) WithGroup(string) slog.Handler            { return c }

func (c *capture) Handle(ctx context.Context, r slog.Record) error {
	if c.tee != nil && c.tee.Enabled(ctx, r.Level) {
		_ = c.tee.Handle(ctx, r)
	}
	if !strings.HasPrefix(r.Message, "kick: ") {
		return nil
	}
	now := time.Now()
	c.last.Store(now.UnixNano())
	if r.Level >= slog.LevelWarn {
		c.warns.Add(1)
	}
	if r.Message == "kick: sweep" {
		e := sweepEnd{at: now}
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "trigger":
				e.trigger = a.Value.String()
			case "servers":
				e.servers = a.Value.Int64()
			case "runner_connections":
				e.runners = a.Value.Int64()
			}
			return true
		})
		select {
		case c.sweeps <- e:
		default: // nobody is measuring; drop
		}
	}
	return nil
}

func (c *capture) lastKick() time.Time { return time.Unix(0, c.last.Load()) }

func (c *capture) drainSweeps() {
	for {
		select {
		case <-c.sweeps:
		default:
			return
		}
	}
}

// awaitSweep waits for the end of a successful sweep whose triggers
// include trigger.
func (c *capture) awaitSweep(t *testing.T, trigger string) sweepEnd {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case e := <-c.sweeps:
			if slices.Contains(strings.Split(e.trigger, ","), trigger) {
				return e
			}
		case <-deadline:
			t.Fatalf("no %s sweep ended within %s (kicker warnings so far: %d)", trigger, waitTimeout, c.warns.Load())
		}
	}
}

// cpuSelf is this process's CPU time (both callouts and the harness).
func cpuSelf() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux the project runs on).
const clockTick = 10 * time.Millisecond

// procCPU is a process's utime+stime from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}
	// Fields after the command name, which is in parentheses: state is
	// the first, utime the 12th and stime the 13th.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu of %d: short /proc stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cpu of %d: bad /proc stat", pid)
	}
	return time.Duration(u+st) * clockTick, nil
}

func (f *fleet) nodesCPU(t *testing.T) []time.Duration {
	t.Helper()
	out := make([]time.Duration, len(f.nodes))
	for i, p := range f.nodes {
		c, err := procCPU(p.PID())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = c
	}
	return out
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

func getJSON(url string, v any) error {
	resp, err := httpClient.Get(url)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	return nil
}

// admitAll is a kick.Policy that refuses nothing: a probe kicker's sweep
// lists every connection and ends none.
type admitAll struct{}

func (admitAll) Admitter(context.Context) (kick.Admit, error) {
	return func(kick.Conn, *kick.Grant) error { return nil }, nil
}

// listingBytes is the payload a full sweep's listing delivers to the kick
// identity's connection (nats.Conn Statistics InBytes), and in how many
// messages (InMsgs), averaged over n sweeps. The replicas' kick connections are inside callout.Serve, so a
// probe kicker of this harness (package kick's own code, on a connection
// of the kick identity to node 0, with a policy that ends nothing) sweeps
// instead; its listing is the replicas' listing.
func (f *fleet) listingBytes(t *testing.T, n, want int) (bytes, msgs int64) {
	t.Helper()
	nc, err := nats.Connect(f.nodes[0].URL, nats.UserInfo(natsembed.KickUser, natsembed.KickPassword), nats.Name("fleet-kick-probe"))
	if err != nil {
		t.Fatalf("probe kicker: %v", err)
	}
	defer nc.Close()
	log := newCapture(nil)
	k, err := kick.New(kick.Config{
		Conn: nc, Account: natsembed.Account, Issuers: []string{natsembed.Account}, Policy: admitAll{},
		SweepInterval: time.Hour, ListInterval: time.Nanosecond, Logger: slog.New(log),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	log.awaitSweep(t, "start")
	var total, totalMsgs int64
	for i := range n {
		b0, m0 := nc.Stats().InBytes, nc.Stats().InMsgs
		k.Sweep("probe")
		e := log.awaitSweep(t, "probe")
		if e.runners != int64(want) || e.servers != servers {
			t.Errorf("probe sweep %d listed %d Runner connections on %d servers, want %d on %d", i, e.runners, e.servers, want, servers)
		}
		st := nc.Stats()
		total += int64(st.InBytes - b0)
		totalMsgs += int64(st.InMsgs - m0)
	}
	return total / int64(n), totalMsgs / int64(n)
}

// vmRSS is this process's resident set.
func vmRSS(t *testing.T) int64 {
	t.Helper()
	return procRSS(t, "self")
}

// nodesRSS is each nats-server's VmRSS, in bytes.
func (f *fleet) nodesRSS(t *testing.T) []int64 {
	t.Helper()
	out := make([]int64, len(f.nodes))
	for i, p := range f.nodes {
		out[i] = procRSS(t, strconv.Itoa(p.PID()))
	}
	return out
}

// procRSS is the VmRSS of /proc/<pid>, in bytes.
func procRSS(t *testing.T, pid string) int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// row is one size's figures.
type row struct {
	conns, connected, retries, children int
	storm                               time.Duration
	sweepWall, sweepCPU                 time.Duration
	nodeCPU                             []time.Duration
	sweepBytes, sweepMsgs               int64
	listed                              []string // per sweep: "runners (servers)"
	deny, revoke, dup                   []time.Duration
	rss                                 int64
}

const header = "| connections | client processes | storm | retries | listed per sweep (servers) | sweep wall | sweep CPU callouts | sweep CPU n0/n1/n2 | bytes/sweep (messages) | node deny p50/p99 | revoke-token p50/p99 | duplicate p50/p99 | callouts' process RSS |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"

func (r row) String() string {
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	var nodes []string
	for _, c := range r.nodeCPU {
		nodes = append(nodes, ms(c))
	}
	return fmt.Sprintf("| %d (%d up) | %d | %s | %d | %s | %s | %s | %s | %d (%d) | %s | %s | %s | %d MiB |\n",
		r.conns, r.connected, r.children, ms(r.storm), r.retries, strings.Join(r.listed, ", "), ms(r.sweepWall), ms(r.sweepCPU), strings.Join(nodes, " / "),
		r.sweepBytes, r.sweepMsgs, spread(r.deny), spread(r.revoke), spread(r.dup), r.rss>>20)
}

// spread is "p50 / p99" by nearest rank.
func spread(d []time.Duration) string {
	if len(d) == 0 {
		return "–"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return fmt.Sprintf("%s / %s", rank(0.50).Round(time.Millisecond), rank(0.99).Round(time.Millisecond))
}
