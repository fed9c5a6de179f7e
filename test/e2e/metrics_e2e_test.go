package e2e

import (
	"bufio"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// sampleNames GETs url (a /metrics) and returns the names of its samples. A
// family with labels appears only once a child exists (client_golang writes
// neither HELP nor TYPE for a vector without one), so a name is counted by
// its samples, never by its HELP line: a family the daemon declares but
// never fills would not show on a dashboard either.
func sampleNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// waitHTTP200 polls url until it answers 200, failing if p exits first.
func waitHTTP200(t *testing.T, p *daemonProc, url string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, url+" answering 200", func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("%s exited (%v):\n%s", p.name, err, p.stderr)
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// Every metric the alerting rules and the Grafana dashboard
// (deploy/monitoring) name is exported by one of the three daemon binaries:
// compass-server, compass-callout and a compass-runner that enrolled at the
// Server's door and connected to NATS through the callout. The families
// whose label values are known in advance are created at zero, so a fresh
// daemon names them; the rest appear with this traffic (an enrollment, an
// authorization, a door authentication).
func TestMonitoringNamesOnlyExportedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	want, err := deploy.MetricNames()
	if err != nil {
		t.Fatal(err)
	}
	bin := buildBinaries(t, "compass-server", "compass-callout", "compass-runner")
	dir := t.TempDir()
	is := testkeys.Issuer(t)
	clusters := verifiertest.ClusterFile(t, dir, verifiertest.ClusterEntry(t, is, dir, "prod"))

	ns := natsembed.ServeForProcess(t, dir)
	certFile, keyFile, caFile := servertest.TLS(t, dir)
	door, serverMetrics := testutil.FreeAddr(t), testutil.FreeAddr(t)
	// The Server on NATS, as deployed: compass_server_nats_connected is
	// exported only with --nats-url.
	srv := startProc(t, filepath.Join(bin, "compass-server"), []string{"serve"},
		"COMPASS_LISTEN="+door, "COMPASS_TLS_CERT="+certFile, "COMPASS_TLS_KEY="+keyFile, "COMPASS_METRICS_ADDR="+serverMetrics,
		"COMPASS_RUNNER_CLUSTERS="+clusters, "COMPASS_DATA_DIR="+filepath.Join(dir, "server"),
		"COMPASS_NATS_URL="+ns.URL, "COMPASS_NATS_USER="+natsembed.ServerUser, "COMPASS_NATS_PASSWORD="+natsembed.ServerPassword)
	calloutMetrics := testutil.FreeAddr(t)
	co := startProc(t, filepath.Join(bin, "compass-callout"), nil, append(ns.Env(),
		"COMPASS_RUNNER_CLUSTERS="+clusters,
		"COMPASS_METRICS_ADDR="+calloutMetrics)...)
	srv.waitLog(t, "door listening", 1)
	co.waitLog(t, "compass-callout answering", 1)

	tokenFile := filepath.Join(dir, "token")
	if _, err := is.WriteTokenFile(tokenFile, kubeissuer.Pod{NodeName: "node-metrics"}, 0); err != nil {
		t.Fatal(err)
	}
	health := testutil.FreeAddr(t)
	rn := startProc(t, filepath.Join(bin, "compass-runner"), nil,
		"COMPASS_TOKEN_FILE="+tokenFile, "COMPASS_SERVER=https://"+door, "COMPASS_CA_FILE="+caFile,
		"COMPASS_NATS_URL="+ns.URL, "COMPASS_HEALTH_ADDR="+health)
	waitHTTP200(t, rn, "http://"+health+"/readyz")

	exported := map[string]map[string]bool{
		"compass-server":  sampleNames(t, "http://"+serverMetrics+"/metrics"),
		"compass-callout": sampleNames(t, "http://"+calloutMetrics+"/metrics"),
		"compass-runner":  sampleNames(t, "http://"+health+"/metrics"),
	}
	// Each daemon's own families are where they belong: a Runner metric from
	// the Runner, a door metric from the Server.
	for daemon, prefix := range map[string]string{
		"compass-server": "compass_door_requests_total", "compass-callout": "compass_callout_decisions_total",
		"compass-runner": "compass_runner_nats_connected",
	} {
		if !exported[daemon][prefix] {
			t.Errorf("%s does not export %s", daemon, prefix)
		}
	}
	var missing []string
	for _, name := range want {
		found := false
		for _, names := range exported {
			found = found || names[name]
		}
		if !found {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the rules or the dashboard name metrics no daemon exports: %v", missing)
	}
	if len(want) < 25 || !slices.Contains(want, "compass_runner_token_remaining_seconds") {
		t.Fatalf("MetricNames found %d names (%v): fewer than the rules and dashboard use", len(want), want)
	}
	t.Logf("%d metric names of the rules and the dashboard, each exported by a daemon", len(want))
}
