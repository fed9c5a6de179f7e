package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/test/natsembed"
)

// Settings of the handover-and-quarantine test, each with its reason.
const (
	// quarantineHandovers is the count: a hundred of the Runner's
	// own handovers, each onto the next of the three nodes.
	quarantineHandovers = 100
	// quarantineRefresh makes the handovers come one after the other, as
	// crossRefresh does; the overlap is the Runner's default.
	quarantineRefresh = 150 * time.Millisecond
	// checksWait bounds the wait for the last handover's duplicate check,
	// which falls due kick.DefaultDuplicateGrace after its authorization.
	checksWait = kick.DefaultDuplicateGrace + 15*time.Second
)

// rotateDialer dials, for every connection of the Runner's link, the node
// after the one the link's current session is on (n0, n1, n2, n0, ...): a
// hundred handovers visit each node a third of the time.
type rotateDialer struct {
	tr *tier
	r  atomic.Pointer[runner.Runner] // nil until the Runner is started: dial n0
	d  net.Dialer
}

func (d *rotateDialer) Dial(network, _ string) (net.Conn, error) {
	to := 0
	if r := d.r.Load(); r != nil {
		if l := r.Link(); l != nil {
			for i, n := range d.tr.nodes {
				if l.Status().ServerID == n.ns.ID() {
					to = (i + 1) % len(d.tr.nodes)
				}
			}
		}
	}
	return d.d.Dial(network, fmt.Sprintf("127.0.0.1:%d", d.tr.nodes[to].port))
}

// A Runner's own reconnects never count towards a quarantine: it hands
// over a hundred times across three nodes (the real runner.Runner, its
// default overlap), every connection authorized by the callout replicas
// and checked for duplicates by a kicker with the production grace and the
// default quarantine threshold and window; every check runs and finds no
// older connection, nothing is displaced, nothing quarantined.
func TestHandoverNeverDisplaces(t *testing.T) {
	tr := newTier(t, tierOpts{replicaNodes: []int{0, 1}, kickUser: true})
	ctx := t.Context()
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "compass.db")
	st := storetest.OpenCurrent(t, dbURL)
	w, err := store.OpenQuarantineWriter(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	reg := prometheus.NewRegistry()
	q, err := callout.NewQuarantine(callout.QuarantineConfig{Store: st, Writer: w, Registerer: reg,
		Policy: store.QuarantinePolicy{After: callout.DefaultQuarantineAfter, Window: callout.DefaultQuarantineWindow}})
	if err != nil {
		t.Fatal(err)
	}
	knc, err := nats.Connect(tr.nodes[2].url(), nats.UserInfo(natsembed.KickUser, natsembed.KickPassword), nats.Name("compass-callout-kick"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(knc.Close)
	kickLogs := &testlog.Buffer{}
	k, err := kick.New(kick.Config{Conn: knc, Account: natsembed.Account, Issuers: tr.replicas[0].r.RunnerIssuers(),
		Policy: callout.RevocationPolicy(nil, nil, nil), Displaced: q, Registerer: reg,
		Logger: slog.New(slog.NewJSONHandler(kickLogs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	q.SetSweeper(k)
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.Run(kctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(requestTimeout):
			t.Error("the kicker did not stop")
		}
	})
	var authorized atomic.Int64
	onAuthorized := func(ev callout.Event) {
		authorized.Add(1)
		k.Authorized(callout.GrantOf(ev))
	}
	tr.authorized.Store(&onAuthorized)

	rot := &rotateDialer{tr: tr}
	var visits [3]atomic.Int64
	h := tr.startRunnerWith(0, func(lc *runner.LinkConfig) {
		lc.Refresh = quarantineRefresh
		lc.CheckEvery = 10 * time.Millisecond
		lc.Jitter = func(time.Duration) time.Duration { return 0 }
		lc.Options = append(lc.Options, nats.SetCustomDialer(rot))
		record := lc.OnEvent
		lc.OnEvent = func(ev runner.LinkEvent) {
			if r := rot.r.Load(); ev.Kind == runner.EventHandover && r != nil {
				for i, n := range tr.nodes {
					if r.Link().Status().ServerID == n.ns.ID() {
						visits[i].Add(1)
					}
				}
			}
			record(ev)
		}
	})
	rot.r.Store(h.r)
	h.evs.wait(t, runner.EventConnected, 1, "Runner "+h.id+" first connect")
	start := time.Now()
	for i := 1; i <= quarantineHandovers; i++ {
		h.evs.wait(t, runner.EventHandover, i, fmt.Sprintf("Runner %s, handover %d", h.id, i))
	}
	took := time.Since(start)
	// The Runner goes on handing over; the checks awaited are those of the
	// authorizations so far.
	upTo := authorized.Load()
	for i := range visits {
		if visits[i].Load() < quarantineHandovers/4 {
			t.Fatalf("handovers onto n%d: %d of %d; want about a third", i, visits[i].Load(), quarantineHandovers)
		}
	}

	// Every authorization's duplicate check ran (the last falls due a grace
	// after the last handover) and found no older connection.
	checked := func() (checks, withOlder int) {
		recs, err := kickLogs.JSONRecords("kick: duplicate checks done")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			c, _ := r["checked"].(float64)
			o, _ := r["with_older"].(float64)
			checks, withOlder = checks+int(c), withOlder+int(o)
		}
		return checks, withOlder
	}
	testutil.Eventually(t, checksWait, "every authorization's duplicate check", func() bool {
		c, _ := checked()
		return int64(c) >= upTo
	})
	checks, withOlder := checked()
	st2 := h.r.Link().Status()
	t.Logf("%d handovers across n0, n1, n2 (%d, %d, %d) in %s with overlap %s; %d authorizations by then, %d duplicate checks since, %d with an older connection; link %d reconnects",
		quarantineHandovers, visits[0].Load(), visits[1].Load(), visits[2].Load(), took.Round(time.Millisecond), runner.DefaultHandoverOverlap,
		upTo, checks, withOlder, st2.Reconnects)
	if upTo < quarantineHandovers+1 {
		t.Fatalf("%d authorizations for %d handovers and the first connect", upTo, quarantineHandovers)
	}
	if withOlder != 0 {
		t.Fatalf("%d duplicate checks found an older connection of the Runner's own", withOlder)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
		switch mf.GetName() {
		case "compass_callout_duplicate_connections_total", "compass_callout_quarantines_total", "compass_callout_displacements_total":
			for _, m := range mf.GetMetric() {
				if v := m.GetCounter().GetValue(); v != 0 {
					t.Fatalf("%s %v = %v after the Runner's own handovers; want 0", mf.GetName(), m.GetLabel(), v)
				}
			}
		}
	}
	for _, name := range []string{"compass_callout_duplicate_connections_total", "compass_callout_quarantines_total", "compass_callout_displacements_total"} {
		if !seen[name] {
			t.Fatalf("%s is not exported: the zero proves nothing", name)
		}
	}
	if qs, err := st.ListQuarantined(ctx); err != nil || len(qs) != 0 {
		t.Fatalf("quarantined after the handovers: %+v, %v", qs, err)
	}
	if _, err := st.GetQuarantine(ctx, h.id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the Runner's displacement record: %v; want none (ErrNotFound)", err)
	}
	if n := h.evs.count(runner.EventDisconnected); n != 0 || st2.Reconnects != 0 {
		t.Fatalf("the Runner lost its connection %d times (%d reconnects): the handovers are not what was tested", n, st2.Reconnects)
	}
}
