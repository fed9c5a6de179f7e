package callout

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/testlog"
)

// The callout's NATS URLs reach its log and errors without credentials: a
// URL that does not parse is refused by its position (nats.go's error would
// quote it), and the connected line masks a lone user, which nats.go sends
// as a token.
func TestNATSURLsNeverShowCredentials(t *testing.T) {
	const secret = "s3cr3t-token"
	_, err := connect(t.Context(), ServeConfig{NATSURLs: "nats://a.example:1, nats://" + secret + "%zz@a.example:1", Connections: 1}, testNATSMetrics(t),
		slog.New(slog.DiscardHandler))
	if want := "--nats-url: natsurl: NATS URL 2 of the list is not a valid URL"; err == nil || err.Error() != want || !errors.Is(err, ErrConfig) {
		t.Fatalf("connect with an unparsable URL = %v, want ErrConfig %q", err, want)
	}

	s := serveNATS(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, Authorization: secret})
	var logs testlog.Buffer
	url := strings.Replace(s.ClientURL(), "nats://", "nats://"+secret+"@", 1)
	conns, err := connect(t.Context(), ServeConfig{NATSURLs: url, Connections: 1}, testNATSMetrics(t), slog.New(slog.NewTextHandler(&logs, nil)))
	for _, c := range conns {
		defer c.Close()
	}
	if err != nil {
		t.Fatalf("connect with a token URL: %v", err)
	}
	if out := logs.String(); !strings.Contains(out, "callout: NATS connected") || !strings.Contains(out, "xxxxx@") || strings.Contains(out, secret) {
		t.Fatalf("the connect log shows the token, or no masked URL:\n%s", out)
	}
}

// The callout's connections never give up: each reconnects for as long as
// the process lives (a NATS outage of any length ends with the callout
// back), and one that starts before NATS keeps trying.
func TestConnectionsNeverGiveUp(t *testing.T) {
	_, nc := plainServer(t)
	conns, err := connect(t.Context(), ServeConfig{NATSURLs: nc.ConnectedUrl(), Connections: 2}, testNATSMetrics(t), slog.New(slog.DiscardHandler))
	for _, c := range conns {
		defer c.Close()
	}
	if err != nil || len(conns) != 2 {
		t.Fatalf("connect: %d connections, %v", len(conns), err)
	}
	for i, c := range conns {
		if c.Opts.MaxReconnect >= 0 || !c.Opts.RetryOnFailedConnect || !c.Opts.IgnoreAuthErrorAbort {
			t.Fatalf("connection %d: MaxReconnects %d, RetryOnFailedConnect %v, IgnoreAuthErrorAbort %v; want unlimited, on and on",
				i, c.Opts.MaxReconnect, c.Opts.RetryOnFailedConnect, c.Opts.IgnoreAuthErrorAbort)
		}
	}
}

// testNATSMetrics is a fresh registry's NATS connection metrics.
func testNATSMetrics(t *testing.T) *natsretry.Metrics {
	t.Helper()
	m, err := natsretry.NewMetrics(prometheus.NewRegistry(), "compass_callout_nats", "the callout", true)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
