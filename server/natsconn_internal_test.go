package server

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/test/natsembed"
)

// logWait bounds every wait on a log line.
const logWait = 15 * time.Second

const serverUserConf = `authorization { users: [ { user: server, password: "server-pwd" } ] }`

// The Server's NATS connection started before any server is up says so once
// (without the password in the URL), connects when one comes up, and logs it.
func TestConnectNATSWaitsForAServer(t *testing.T) {
	addr := testutil.FreeAddr(t)
	logs := &testlog.Buffer{}
	closed := make(chan struct{})
	nc, err := connectNATS(NATSConfig{URL: "nats://server:server-pwd@" + addr, User: "server", Password: "server-pwd", Name: "compass-server"},
		testNATSMetrics(t), slog.New(slog.NewTextHandler(logs, nil)), closed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	want := fmt.Sprintf(`msg="server: no NATS server reachable yet; retrying in the background (commands to Runners and last_seen wait for it)" urls=nats://server:xxxxx@%s retry_wait=2s retry_wait_max=10s`, addr)
	if !strings.Contains(logs.String(), want) {
		t.Fatalf("no waiting line %q:\n%s", want, logs.String())
	}
	natsembed.Serve(t, fmt.Sprintf("listen: %q\n%s", addr, serverUserConf), nil)
	logs.WaitFor(t, logWait, `msg="server: NATS connected" url=nats://server:xxxxx@`+addr, 1)
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush after connect: %v", err)
	}
	if strings.Contains(logs.String(), "server-pwd") {
		t.Fatal("the password reached the log")
	}
}

// Given a URL list, the Server's connection uses whichever is up; it learns
// the cluster's other nodes from INFO, and when its node goes it reconnects
// to one it was never configured with.
func TestConnectNATSSeveralURLsAndClusterDiscovery(t *testing.T) {
	route := func(a *natsserver.Server) string {
		if a == nil {
			return ""
		}
		return fmt.Sprintf(`routes: [ "nats://127.0.0.1:%d" ]`, a.ClusterAddr().Port)
	}
	node := func(seed *natsserver.Server) *natsserver.Server {
		return natsembed.Serve(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
%s
cluster { name: compass, listen: "127.0.0.1:-1", %s }
`, serverUserConf, route(seed)), nil)
	}
	a := node(nil)
	b := node(a)
	logs := &testlog.Buffer{}
	closed := make(chan struct{})
	// The first URL has nothing behind it; nats.go tries both in random order.
	nc, err := connectNATS(NATSConfig{URL: "nats://" + testutil.FreeAddr(t) + ", " + a.ClientURL(), User: "server", Password: "server-pwd", Name: "compass-server"},
		testNATSMetrics(t), slog.New(slog.NewTextHandler(logs, nil)), closed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	logs.WaitFor(t, logWait, `msg="server: NATS connected"`, 1)
	if got := nc.ConnectedUrl(); got != a.ClientURL() {
		t.Fatalf("connected to %s, want %s", got, a.ClientURL())
	}
	bURL := strings.TrimPrefix(b.ClientURL(), "nats://")
	if !strings.Contains(strings.Join(nc.DiscoveredServers(), ","), bURL) {
		// b joined the cluster before the connection: it is in the first
		// INFO, or in one that followed the route.
		logs.WaitFor(t, logWait, bURL, 1)
	}

	// A request answered on b through the connection, before and after a goes.
	sub, err := nats.Connect(b.ClientURL(), nats.UserInfo("server", "server-pwd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	if _, err := sub.Subscribe("compass.test.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	request := func(what string) {
		t.Helper()
		m, err := nc.Request("compass.test.echo", []byte(what), 5*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", what, err)
		}
		if !bytes.Equal(m.Data, []byte(what)) {
			t.Fatalf("echo %q, want %q", m.Data, what)
		}
	}
	// b's subscription reaches a over the route asynchronously, inside
	// nats-server's own goroutines, which expose no event to wait on.
	testutil.Eventually(t, 10*time.Second, a.Name()+" to learn of a subscriber on compass.test.echo", func() bool {
		return a.GlobalAccount().SubscriptionInterest("compass.test.echo")
	})
	request("before")
	a.Shutdown()
	logs.WaitFor(t, logWait, `msg="server: NATS reconnected" url=nats://`+bURL, 1)
	request("after")
}

// testNATSMetrics is a fresh registry's NATS connection metrics.
func testNATSMetrics(t *testing.T) *natsretry.Metrics {
	t.Helper()
	m, err := natsretry.NewMetrics(prometheus.NewRegistry(), "compass_server_nats", "the Server", false)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A password the servers refuse (a change made in the wrong order) is
// retried for ever, the refusal logged at ERROR in the server's words and
// counted by cause; once the servers accept the password the Server is
// connected again with no restart. nats.go's default closes a connection for
// good after the same refusal twice.
func TestConnectNATSRetriesARefusedPasswordForEver(t *testing.T) {
	reg := prometheus.NewRegistry()
	nm, err := natsretry.NewMetrics(reg, "compass_server_nats", "the Server", false)
	if err != nil {
		t.Fatal(err)
	}
	first := natsembed.Serve(t, `listen: "127.0.0.1:-1"
authorization { users: [ { user: server, password: "the-next-pwd" } ] }`, nil)
	addr := strings.TrimPrefix(first.ClientURL(), "nats://")
	logs := &testlog.Buffer{}
	closed := make(chan struct{})
	nc, err := connectNATS(NATSConfig{URL: "nats://" + addr, User: "server", Password: "server-pwd", Name: "compass-server"},
		nm, slog.New(slog.NewTextHandler(logs, nil)), closed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	logs.WaitFor(t, logWait, `level=ERROR msg="server: NATS refused the connection's credentials`, 1)
	if !strings.Contains(logs.String(), `error="nats: Authorization Violation" cause=authorization_refused`) {
		t.Fatalf("the ERROR record lacks the server's words or the cause:\n%s", logs.String())
	}
	// Three refusals: past the two after which nats.go would give up.
	testutil.Eventually(t, logWait, "three refusals counted", func() bool {
		return testutil.Counter(t, reg, "compass_server_nats_connect_failures_total",
			map[string]string{"connection": "server", "cause": natsretry.CauseAuthorization}) >= 3
	})
	if nc.IsClosed() {
		t.Fatal("the connection closed for good after refusals")
	}
	// The operator completes the change: the node restarts with the
	// password the Server has.
	first.Shutdown()
	natsembed.Serve(t, fmt.Sprintf("listen: %q\n%s", addr, serverUserConf), nil)
	logs.WaitFor(t, logWait, `msg="server: NATS connected" url=nats://`+addr, 1)
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush once accepted: %v", err)
	}
	if strings.Contains(logs.String(), "server-pwd") {
		t.Fatal("the password reached the log")
	}
}
