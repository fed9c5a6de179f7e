package callout_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// quarantineWait bounds each wait of the quarantine tests: a ping-pong to
// the threshold takes (after+1) duplicate graces of 1 s and as many
// reconnects of pingPongReconnect; the rest is a poll of 100 ms.
const quarantineWait = 20 * time.Second

// pingPongReconnect is how soon a displaced client comes back: a Runner
// reconnects at once, and nats.go's default wait is 2 s.
const pingPongReconnect = 50 * time.Millisecond

// pingPonger is a client that reconnects for ever with one token, as both
// the original Runner and a copy of its token do. It counts its
// connections.
type pingPonger struct {
	nc       *nats.Conn
	connects atomic.Int64
}

func startPingPonger(t *testing.T, url, token, name string) *pingPonger {
	t.Helper()
	p := &pingPonger{}
	p.connects.Store(1)
	nc, err := nats.Connect(url, nats.Token(token), nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(pingPongReconnect), nats.ReconnectJitter(0, 0),
		// As the Runner (runner/link.go): refusals do not stop the retries.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectHandler(func(*nats.Conn) { p.connects.Add(1) }),
		// Refusals are expected once the ID is quarantined; the default
		// handler would print them.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("%s connect: %v", name, err)
	}
	p.nc = nc
	t.Cleanup(nc.Close)
	return p
}

// refused fails t unless a fresh CONNECT with token is refused as not
// authorized.
func refused(t *testing.T, url, token, why string) {
	t.Helper()
	_, err := dialRunner(t, url, token)
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("%s: a fresh connect = %v; want %v", why, err, nats.ErrAuthorization)
	}
}

// quarantineConfig sets a short duplicate grace (the minimum, 1 s), a
// threshold of after and a window long enough for the ping-pong.
func quarantineConfig(after int) func(*callout.ServeConfig) {
	return func(c *callout.ServeConfig) {
		c.DuplicateGrace = kick.MinDuplicateGrace
		c.QuarantineAfter, c.QuarantineWindow = after, time.Minute
	}
}

// A copied token, minted or projected, and its original ping-pong: each
// connect ends the other's connection after the grace. Past the threshold
// the Runner ID is quarantined: both connections are ended, every connect
// refused, the quarantine logged at ERROR naming both clients (host:port)
// and shown in the metrics the alert reads. Once the copy is gone and the
// operator clears the quarantine, the original connects again.
func TestQuarantineEndsAPingPong(t *testing.T) {
	const after = 2
	for _, tc := range []struct {
		name  string
		token func(t *testing.T, is *kubeissuer.Issuer, db store.Store) (token, runnerID string)
	}{
		{"minted", func(t *testing.T, _ *kubeissuer.Issuer, db store.Store) (string, string) {
			tok, _, err := db.Mint(t.Context(), verifier.SubjectRunner, "build-host-a")
			if err != nil {
				t.Fatal(err)
			}
			return tok, "build-host-a"
		}},
		{"projected", func(t *testing.T, is *kubeissuer.Issuer, _ store.Store) (string, string) {
			return podToken(t, is, "node-a", ""), "prod/node-a"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := testkeys.Issuer(t)
			k := startKicking(t, is, "", true, quarantineConfig(after))
			tok, id := tc.token(t, is, k.db)
			bystanderTok, _, err := k.db.Mint(t.Context(), verifier.SubjectRunner, "bystander")
			if err != nil {
				t.Fatal(err)
			}
			bystander := connectRunner(t, k.natsURL, bystanderTok)

			original := startPingPonger(t, k.natsURL, tok, "original")
			copied := startPingPonger(t, k.natsURL, tok, "copy")
			k.waitMetric(t, "compass_callout_quarantines_total", "1")
			k.waitMetric(t, "compass_callout_runners_quarantined", "1")
			k.waitMetric(t, "compass_callout_displacements_total{result=\"recorded\"}", fmt.Sprint(after+1))
			testutil.Eventually(t, quarantineWait, "both connections ended", func() bool {
				return !original.nc.IsConnected() && !copied.nc.IsConnected()
			})
			refused(t, k.natsURL, tok, "the quarantined ID")
			if got := k.metric(t, "compass_callout_quarantine_refusals_total"); got == "0" || got == "" {
				t.Fatalf("quarantine refusals = %q; want the refused connects counted", got)
			}
			bystander.stillOpen(t)

			recs, err := k.logs.JSONRecords("callout: runner ID quarantined: its connections kept displacing each other (a copied token); every connection is ended and connects and Enroll are refused until compass-server clear-quarantine")
			if err != nil || len(recs) != 1 {
				t.Fatalf("quarantine log records = %v, %v; want one", recs, err)
			}
			r := recs[0]
			if r["level"] != "ERROR" || r["runner_id"] != id || r["displacements"] != float64(after+1) {
				t.Fatalf("quarantine log record = %v; want ERROR for %s after %d displacements", r, id, after+1)
			}
			for _, f := range []string{"newer_client", "older_client"} {
				s, _ := r[f].(string)
				if h, p, err := net.SplitHostPort(s); err != nil || h == "" || p == "" {
					t.Fatalf("quarantine log %s = %q; want host:port", f, s)
				}
			}
			q, err := k.db.GetQuarantine(t.Context(), id)
			if err != nil || !q.Quarantined() || q.Displacements != after+1 {
				t.Fatalf("the store's record = %+v, %v; want quarantined after %d", q, err, after+1)
			}
			if s := k.logs.String(); strings.Contains(s, tok) || strings.Contains(s, bystanderTok) {
				t.Fatal("the log holds a Runner's token")
			}

			// The copy is found and stopped; the operator clears the
			// quarantine; the original, still retrying, is let in at the
			// next poll and stays (no one displaces it any more).
			copied.nc.Close()
			if _, err := k.db.ClearQuarantine(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, quarantineWait, "the original connected again", original.nc.IsConnected)
			k.waitMetric(t, "compass_callout_runners_quarantined", "0")
			if err := original.nc.FlushTimeout(healthWait); err != nil {
				t.Fatalf("the original after the clear: %v", err)
			}
		})
	}
}

// With --duplicates keep nothing is kicked, so nothing is displaced or
// quarantined however long the two connections overlap.
func TestQuarantineNeverWithDuplicatesKeep(t *testing.T) {
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", true, func(c *callout.ServeConfig) {
		quarantineConfig(1)(c)
		c.Duplicates = kick.DuplicatesKeep
	})
	tok := podToken(t, is, "node-a", "")
	first := connectRunner(t, k.natsURL, tok)
	// Each connect is a duplicate, kept: four of them are well past the
	// threshold of 1.
	for i := range 4 {
		connectRunner(t, k.natsURL, tok)
		k.waitMetric(t, `compass_callout_duplicate_connections_total{action="kept"}`, fmt.Sprint((i+1)*(i+2)/2))
	}
	first.stillOpen(t)
	for _, m := range []string{"compass_callout_quarantines_total", "compass_callout_runners_quarantined", `compass_callout_displacements_total{result="recorded"}`} {
		if got := k.metric(t, m); got != "0" {
			t.Fatalf("%s = %q with --duplicates keep; want 0", m, got)
		}
	}
	if qs, err := k.db.ListQuarantined(t.Context()); err != nil || len(qs) != 0 {
		t.Fatalf("quarantined with --duplicates keep: %+v, %v", qs, err)
	}
}

// replica is one compass-callout (callout.Serve) that the test stops.
type replica struct {
	metrics string
	logs    *testlog.Buffer
	stop    func()
}

// startReplica runs a callout on cfg until stop (or the test's end).
func startReplica(t *testing.T, cfg callout.ServeConfig) *replica {
	t.Helper()
	r := &replica{logs: &testlog.Buffer{}}
	cfg.Logger = slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ready := make(chan string, 1)
	cfg.Ready = func(a string) { ready <- a }
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- callout.Serve(ctx, cfg) }()
	var stopped atomic.Bool
	r.stop = func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("callout.Serve: %v", err)
		}
	}
	t.Cleanup(r.stop)
	select {
	case r.metrics = <-ready:
	case err := <-done:
		t.Fatalf("callout.Serve: %v", err)
	case <-time.After(healthWait):
		t.Fatal("the callout did not become ready")
	}
	return r
}

func (r *replica) metric(t *testing.T, name string) string {
	t.Helper()
	return (&kickRun{metrics: r.metrics}).metric(t, name)
}

// A quarantine is shared: two replicas answer one NATS server; a
// quarantine recorded in the store by another writer (a third replica's
// count) ends the ID's connection through whichever replica sweeps first
// and is refused by both within about two polls of the default
// --revocation-poll; a new callout on the same store refuses it from its
// first connect on; the Server's store shows it.
func TestQuarantineSharedAcrossReplicasAndRestarts(t *testing.T) {
	is := testkeys.Issuer(t)
	dir := t.TempDir()
	ca, err := is.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	clusterFile := filepath.Join(dir, "clusters.yaml")
	k := &kickRun{clusterFile: clusterFile, caFile: ca, issuerURL: is.URL()}
	k.writeClusters(t, "", true)
	dbURL := "sqlite://" + filepath.Join(dir, "compass.db")
	db := storetest.OpenCurrent(t, dbURL)
	ns := natsembed.ServeForProcess(t, dir)
	cfg := ns.ServeConfig()
	cfg.RunnerClusters, cfg.DatabaseURL, cfg.MetricsAddr, cfg.Connections = clusterFile, dbURL, "127.0.0.1:0", 1
	quarantineConfig(2)(&cfg)
	cfg.RevocationPoll = 0 // the default, 1 s: the bound the issue sets
	a, b := startReplica(t, cfg), startReplica(t, cfg)

	tok := podToken(t, is, "node-a", "")
	victim := connectRunner(t, ns.URL, tok)
	other := connectRunner(t, ns.URL, podToken(t, is, "node-b", ""))

	// Another replica's count passes the threshold.
	w, err := store.OpenQuarantineWriter(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	var quarantinedAt time.Time
	for range 3 {
		q, _, err := w.RecordDisplacement(t.Context(), store.Displacement{RunnerID: "prod/node-a", Newer: "10.0.0.2:40000", Older: "10.0.0.1:50000"},
			store.QuarantinePolicy{After: 2, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		quarantinedAt = q.QuarantinedAt
	}
	if quarantinedAt.IsZero() {
		t.Fatal("the third displacement did not quarantine")
	}
	took := victim.closedWithin(t, time.Now(), 2*time.Second+revocationBound)
	t.Logf("the quarantined ID's connection ended %s after the store was written", took)
	for name, r := range map[string]*replica{"a": a, "b": b} {
		testutil.Eventually(t, quarantineWait, "replica "+name+" shows the quarantine", func() bool {
			return r.metric(t, "compass_callout_runners_quarantined") == "1"
		})
	}
	// Each connect goes to one of the two (a queue group): try enough
	// that both answered.
	for range 4 {
		refused(t, ns.URL, tok, "the ID quarantined by another replica")
	}
	other.stillOpen(t)
	if qs, err := db.ListQuarantined(t.Context()); err != nil || len(qs) != 1 || qs[0].RunnerID != "prod/node-a" {
		t.Fatalf("the store's quarantined IDs = %+v, %v", qs, err)
	}

	// Both stop; a new callout on the same store refuses the ID from its
	// first answer on.
	a.stop()
	b.stop()
	startReplica(t, cfg)
	refused(t, ns.URL, tok, "the quarantined ID after a restart")
	if _, err := dialRunner(t, ns.URL, podToken(t, is, "node-b", "")); err != nil {
		t.Fatalf("another Runner after the restart: %v", err)
	}
}

// The verifiertest import is the cluster file's second cluster
// (kickRun.writeClusters).
var _ = verifiertest.StaticCluster
