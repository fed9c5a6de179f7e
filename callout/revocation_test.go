package callout_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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

// revocationBound is the bound from a change applied to the last
// live connection of the Runner closing (2 s), with slack for a loaded test
// machine; docs/performance.md has the measured figures.
const revocationBound = 5 * time.Second

// kickRun is callout.Serve with a kick identity against an in-process
// nats-server, with the cluster file and its reload under the test's control.
type kickRun struct {
	natsURL     string
	clusterFile string
	caFile      string
	issuerURL   string
	reload      chan os.Signal
	logs        *testlog.Buffer
	metrics     string
	db          store.Store
}

// startKicking runs a callout for cluster prod at is (with deny as the
// cluster's deny block, "" for none) and, with withStore, a SQLite store of
// minted tokens. mod adjusts the config.
func startKicking(t *testing.T, is *kubeissuer.Issuer, deny string, withStore bool, mod func(*callout.ServeConfig)) *kickRun {
	t.Helper()
	dir := t.TempDir()
	ca, err := is.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	run := &kickRun{clusterFile: filepath.Join(dir, "clusters.yaml"), caFile: ca, issuerURL: is.URL(),
		reload: make(chan os.Signal, 1), logs: &testlog.Buffer{}}
	run.writeClusters(t, deny, true)
	var dbURL string
	if withStore {
		dbURL = "sqlite://" + filepath.Join(dir, "compass.db")
		run.db = storetest.OpenCurrent(t, dbURL)
	}
	ns := natsembed.ServeForProcess(t, dir)
	run.natsURL = ns.URL
	cfg := ns.ServeConfig()
	cfg.RunnerClusters, cfg.DatabaseURL, cfg.MetricsAddr, cfg.Connections = run.clusterFile, dbURL, "127.0.0.1:0", 1
	cfg.Logger = slog.New(slog.NewJSONHandler(run.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.ReloadSignals = run.reload
	cfg.RevocationPoll = 100 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	run.metrics = runServe(t, cfg)
	return run
}

// writeClusters writes the cluster file: prod with deny (when withProd),
// and always a second cluster, other, so that removing prod leaves a valid file.
func (k *kickRun) writeClusters(t *testing.T, deny string, withProd bool) {
	t.Helper()
	var b strings.Builder
	b.WriteString("clusters:\n")
	if withProd {
		fmt.Fprintf(&b, "  - name: prod\n    issuer: %s\n    caFile: %s\n", k.issuerURL, k.caFile)
		if deny != "" {
			fmt.Fprintf(&b, "    deny:\n%s", deny)
		}
	}
	b.WriteString(verifiertest.StaticCluster(t, filepath.Dir(k.clusterFile), "other"))
	if err := os.WriteFile(k.clusterFile, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// applyReload sends the reload signal and returns when it was sent.
func (k *kickRun) applyReload(t *testing.T) time.Time {
	t.Helper()
	k.reload <- syscall.SIGHUP
	return time.Now()
}

// runnerConn is a Runner's NATS connection, without reconnects, so that a
// kick shows as its close.
type runnerConn struct {
	nc     *nats.Conn
	closed chan time.Time
}

func connectRunner(t *testing.T, url, token string) *runnerConn {
	t.Helper()
	rc, err := dialRunner(t, url, token)
	if err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	return rc
}

// dialRunner is connectRunner that returns the CONNECT's error.
func dialRunner(t *testing.T, url, token string) (*runnerConn, error) {
	t.Helper()
	rc := &runnerConn{closed: make(chan time.Time, 1)}
	nc, err := nats.Connect(url, nats.Token(token), nats.NoReconnect(), nats.Name("runner"),
		nats.ClosedHandler(func(*nats.Conn) { rc.closed <- time.Now() }))
	if err != nil {
		return nil, err
	}
	rc.nc = nc
	t.Cleanup(nc.Close)
	return rc, nil
}

// closedWithin fails the test unless the connection closes within bound of
// since, and returns how long it took.
func (rc *runnerConn) closedWithin(t *testing.T, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	select {
	case at := <-rc.closed:
		return at.Sub(since)
	case <-time.After(bound):
		t.Fatalf("the Runner's connection was still open %s after the change", bound)
	}
	return 0
}

// stillOpen fails the test if the connection closed.
func (rc *runnerConn) stillOpen(t *testing.T) {
	t.Helper()
	if err := rc.nc.FlushTimeout(healthWait); err != nil || rc.nc.IsClosed() {
		t.Fatalf("an unaffected Runner's connection is down: %v", err)
	}
}

func (k *kickRun) metric(t *testing.T, name string) string {
	t.Helper()
	_, body := get(t, "http://"+k.metrics+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return rest
		}
	}
	return ""
}

// waitMetric waits until the metric line has value want.
func (k *kickRun) waitMetric(t *testing.T, name, want string) {
	t.Helper()
	testutil.Eventually(t, healthWait, fmt.Sprintf("%s = %q", name, want), func() bool { return k.metric(t, name) == want })
}

func podToken(t *testing.T, is *kubeissuer.Issuer, node, uid string) string {
	t.Helper()
	tok, err := is.Token(kubeissuer.Pod{NodeName: node, NodeUID: uid}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A connected Runner loses its live NATS connection within the bound when
// the operator denies its node by name, by UID, or removes its cluster; the
// other Runners stay connected; the kick is logged at info level with the
// Runner ID and the reason, never the token, and counted.
func TestKickOnClusterFileChange(t *testing.T) {
	const (
		uidA = "0a4f0e6c-6f3c-4d0c-9b53-8b1f7d0c1a01"
		uidB = "0a4f0e6c-6f3c-4d0c-9b53-8b1f7d0c1a02"
	)
	for _, tc := range []struct {
		name   string
		deny   string // the deny block applied
		remove bool   // remove cluster prod instead
		reason kick.Reason
	}{
		{"deny by node name", "      nodes: [node-a]\n", false, kick.ReasonNodeDenied},
		{"deny by node UID", "      nodeUIDs: [" + uidA + "]\n", false, kick.ReasonNodeDenied},
		{"cluster removed", "", true, kick.ReasonClusterRemoved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := testkeys.Issuer(t)
			k := startKicking(t, is, "", false, nil)
			tokA := podToken(t, is, "node-a", uidA)
			a := connectRunner(t, k.natsURL, tokA)
			b := connectRunner(t, k.natsURL, podToken(t, is, "node-b", uidB))

			k.writeClusters(t, tc.deny, !tc.remove)
			took := a.closedWithin(t, k.applyReload(t), revocationBound)
			t.Logf("connection ended %s after the reload", took)
			want := []string{"prod/node-a"}
			if tc.remove {
				// Every Runner of the cluster goes.
				b.closedWithin(t, time.Now(), revocationBound)
				want = append(want, "prod/node-b")
			} else {
				b.stillOpen(t)
			}
			k.waitMetric(t, fmt.Sprintf(`compass_callout_kicks_total{reason=%q,result="kicked"}`, tc.reason), fmt.Sprint(len(want)))
			recs, err := k.logs.JSONRecords("kick: runner connection ended")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range recs {
				if r["reason"] != string(tc.reason) || r["level"] != "INFO" {
					t.Fatalf("kick log record %v, want INFO with reason %s", r, tc.reason)
				}
				got = append(got, fmt.Sprint(r["runner_id"]))
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("kick log records name %v, want %v", got, want)
			}
			if strings.Contains(k.logs.String(), tokA) {
				t.Fatal("the log holds the Runner's token")
			}
		})
	}
}

// A minted token revoked in the store by another process (the store written
// directly, as revoke-token does) ends its Runner's live connection within
// the poll interval and the bound; another minted Runner stays.
func TestKickOnTokenRevokedInStore(t *testing.T) {
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", true, nil)
	ctx := t.Context()
	tokA, infoA, err := k.db.Mint(ctx, verifier.SubjectRunner, "build-host-a")
	if err != nil {
		t.Fatal(err)
	}
	tokB, _, err := k.db.Mint(ctx, verifier.SubjectRunner, "build-host-b")
	if err != nil {
		t.Fatal(err)
	}
	a := connectRunner(t, k.natsURL, tokA)
	b := connectRunner(t, k.natsURL, tokB)
	if _, err := k.db.Revoke(ctx, infoA.ID); err != nil {
		t.Fatal(err)
	}
	took := a.closedWithin(t, time.Now(), revocationBound)
	t.Logf("connection ended %s after the revocation returned", took)
	b.stillOpen(t)
	k.waitMetric(t, `compass_callout_kicks_total{reason="token_revoked",result="kicked"}`, "1")
	if s := k.logs.String(); strings.Contains(s, tokA) || strings.Contains(s, tokB) {
		t.Fatal("the log holds a Runner's token")
	}
}

// A second process with a copy of a Runner's token connects: the older
// connection is ended after the grace, the event is logged with both client
// addresses and counted, and the documented alert's expression moves.
func TestDuplicateRunnerIDEndsTheOlderConnection(t *testing.T) {
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", false, func(c *callout.ServeConfig) { c.DuplicateGrace = kick.MinDuplicateGrace })
	tok := podToken(t, is, "node-a", "")
	first := connectRunner(t, k.natsURL, tok)
	copied := connectRunner(t, k.natsURL, tok)
	first.closedWithin(t, time.Now(), kick.MinDuplicateGrace+revocationBound)
	copied.stillOpen(t)
	k.waitMetric(t, `compass_callout_duplicate_connections_total{action="kicked"}`, "1")
	k.waitMetric(t, `compass_callout_kicks_total{reason="duplicate",result="kicked"}`, "1")
	recs, err := k.logs.JSONRecords("kick: runner ID has more than one live connection (a reconnect race or a copied token)")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0]["runner_id"] != "prod/node-a" || recs[0]["client"] == "" || recs[0]["older_clients"] == nil {
		t.Fatalf("duplicate log records = %v, want one for prod/node-a naming both clients", recs)
	}
	if strings.Contains(k.logs.String(), tok) {
		t.Fatal("the log holds the Runner's token")
	}
}

// With --duplicates keep, both connections stay; the duplicate is logged and
// counted as kept.
func TestDuplicateRunnerIDKeptWhenAsked(t *testing.T) {
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", false, func(c *callout.ServeConfig) {
		c.DuplicateGrace, c.Duplicates = kick.MinDuplicateGrace, kick.DuplicatesKeep
	})
	tok := podToken(t, is, "node-a", "")
	first := connectRunner(t, k.natsURL, tok)
	copied := connectRunner(t, k.natsURL, tok)
	k.waitMetric(t, `compass_callout_duplicate_connections_total{action="kept"}`, "1")
	first.stillOpen(t)
	copied.stillOpen(t)
	if got := k.metric(t, `compass_callout_kicks_total{reason="duplicate",result="kicked"}`); got != "0" {
		t.Fatalf("duplicate kicks = %s, want 0", got)
	}
}

// A signing key pulled at the issuer (a leaked key) and a reload end the live
// connections its tokens opened; a Runner whose token the new key signed stays.
func TestKickOnPulledSigningKey(t *testing.T) {
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", false, nil)
	oldKID := is.SigningKey().KeyID
	leaked := connectRunner(t, k.natsURL, podToken(t, is, "node-a", ""))
	if _, err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	// The operator's reload fetches the new key past the kid-miss cooldown
	// (which the first CONNECT may have used, racing the start-up load); the
	// old key is still published, so nothing is ended yet.
	k.applyReload(t)
	var fresh *runnerConn
	freshTok := podToken(t, is, "node-b", "")
	testutil.Eventually(t, healthWait, "a token of the new key accepted after the reload", func() bool {
		var err error
		fresh, err = dialRunner(t, k.natsURL, freshTok)
		return err == nil
	})
	is.Unpublish(oldKID)

	took := leaked.closedWithin(t, k.applyReload(t), revocationBound)
	t.Logf("connection ended %s after the reload", took)
	fresh.stillOpen(t)
	k.waitMetric(t, `compass_callout_kicks_total{reason="key_removed",result="kicked"}`, "1")
}

// With the file poll instead of SIGHUP, a deny reaches the live connection
// within the poll interval plus the bound.
func TestKickOnClusterFileChangeByPoll(t *testing.T) {
	const poll = 200 * time.Millisecond
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", false, func(c *callout.ServeConfig) { c.ClusterFilePoll = poll })
	a := connectRunner(t, k.natsURL, podToken(t, is, "node-a", ""))
	k.writeClusters(t, "      nodes: [node-a]\n", true)
	took := a.closedWithin(t, time.Now(), poll+revocationBound)
	t.Logf("connection ended %s after the file was written (poll %s)", took, poll)
}

// A minted token's TTL passing ends its live connection: the user JWT never
// outlives the token, so the server ends it at the token's expiry.
func TestMintedTokenTTLEndsTheConnection(t *testing.T) {
	const ttl = 2 * time.Second
	is := testkeys.Issuer(t)
	k := startKicking(t, is, "", true, nil)
	tok, _, err := k.db.Mint(t.Context(), verifier.SubjectRunner, "ci-job", store.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	minted := time.Now()
	a := connectRunner(t, k.natsURL, tok)
	took := a.closedWithin(t, minted, ttl+revocationBound)
	if took < ttl-time.Second {
		t.Fatalf("the connection ended %s after minting, before the token's TTL %s", took, ttl)
	}
	t.Logf("connection ended %s after minting (TTL %s)", took, ttl)
}
