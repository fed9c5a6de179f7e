package callout_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
)

// A kick identity the servers refuse at start (its password changed on the
// servers first, the callout's Secret not yet) is retried for ever: the
// refusal is an ERROR in the server's words, the kick connection's metrics
// say it is down and why, sweeps fail naming the cause, and once the
// servers accept the password again revocation resumes by itself: a node
// denied afterwards loses its Runner's connection within the bound, with no
// restart of the callout. nats.go's default abandons the connection after
// the second refusal.
func TestKickIdentityRefusedThenRestoredResumesRevocation(t *testing.T) {
	is := testkeys.Issuer(t)
	dir := t.TempDir()
	ca, err := is.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	seedFile := filepath.Join(dir, "callout-issuer.nk")
	issuer := natsembed.WriteIssuerSeed(t, seedFile)
	addr := testutil.FreeAddr(t)
	conf := strings.Replace(natsembed.ForProcessConfig(issuer, ""), `listen: "127.0.0.1:-1"`, fmt.Sprintf("listen: %q", addr), 1)
	kickPwd := strconv.Quote(natsembed.KickPassword)
	if strings.Count(conf, kickPwd) != 1 {
		t.Fatalf("the configuration holds the kick password %d times, want 1", strings.Count(conf, kickPwd))
	}
	// The servers moved to a password the callout does not have yet.
	first := natsembed.Serve(t, strings.Replace(conf, kickPwd, strconv.Quote("the-next-kick-password"), 1), nil)

	k := &kickRun{clusterFile: filepath.Join(dir, "clusters.yaml"), caFile: ca, issuerURL: is.URL(),
		reload: make(chan os.Signal, 1), logs: &testlog.Buffer{}, natsURL: "nats://" + addr}
	k.writeClusters(t, "", true)
	cfg := (&natsembed.ForProcess{URL: k.natsURL, IssuerSeedFile: seedFile}).ServeConfig()
	cfg.RunnerClusters, cfg.MetricsAddr, cfg.Connections = k.clusterFile, "127.0.0.1:0", 1
	cfg.Logger = slog.New(slog.NewJSONHandler(k.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.ReloadSignals = k.reload
	cfg.SweepInterval = 200 * time.Millisecond
	k.metrics = runServe(t, cfg)

	k.logs.WaitFor(t, healthWait, `"msg":"callout: kick identity: NATS refused the connection's credentials`, 1)
	recs, err := k.logs.JSONRecords("callout: kick identity: NATS refused the connection's credentials (a password, nkey or credentials file the servers do not accept, or not yet); retrying for ever")
	if err != nil || len(recs) == 0 {
		t.Fatalf("no refusal record (%v):\n%s", err, k.logs.String())
	}
	if r := recs[0]; r["level"] != "ERROR" || r["connection"] != "kick" || r["error"] != "nats: Authorization Violation" || r["cause"] != "authorization_refused" {
		t.Fatalf("refusal record %v, want ERROR, connection kick, the server's words, cause authorization_refused", r)
	}
	// Past the second refusal, after which nats.go would have given up.
	testutil.Eventually(t, healthWait, "three refusals of the kick identity counted", func() bool {
		n, _ := strconv.Atoi(k.metric(t, `compass_callout_nats_connect_failures_total{cause="authorization_refused",connection="kick"}`))
		return n >= 3
	})
	k.waitMetric(t, `compass_callout_nats_connected{connection="kick"}`, "0")
	k.waitMetric(t, `compass_callout_nats_connected{connection="responder-0"}`, "1")
	k.waitMetric(t, "compass_callout_kicks_failing", "1")
	k.logs.WaitFor(t, healthWait, kick.ErrNotConnected.Error()+` (RECONNECTING; last error: nats: Authorization Violation)`, 1)

	// The operator gives the servers the password the callout has (or the
	// callout the new one): the node restarts with it.
	first.Shutdown()
	natsembed.Serve(t, conf, nil)
	k.waitMetric(t, `compass_callout_nats_connected{connection="kick"}`, "1")
	k.waitMetric(t, "compass_callout_kicks_failing", "0")

	// Revocation works again.
	const uid = "0a4f0e6c-6f3c-4d0c-9b53-8b1f7d0c1a01"
	k.logs.WaitFor(t, healthWait, `"msg":"callout: NATS reconnected"`, 1)
	tok := podToken(t, is, "node-a", uid)
	var a *runnerConn
	// The responder's subscription reaches the restarted server just after
	// its reconnect is reported; a CONNECT before that is refused.
	testutil.Eventually(t, healthWait, "a Runner to connect after the restart", func() bool {
		rc, err := dialRunner(t, k.natsURL, tok)
		a = rc
		return err == nil
	})
	k.writeClusters(t, "      nodes: [node-a]\n", true)
	took := a.closedWithin(t, k.applyReload(t), revocationBound)
	t.Logf("a denied node's connection ended %s after the reload, with the kick identity restored", took)
	if strings.Contains(k.logs.String(), natsembed.KickPassword) {
		t.Fatal("the log holds the kick password")
	}
}
