package callout

import (
	"log/slog"
	"testing"
)

// URLs are logged without credentials: a password, or a lone user (which
// nats.go sends as a token), becomes "redacted"; a URL without a scheme is
// shown as nats.go reads it; one that does not parse is not shown at all.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://a.example:4222":        "nats://a.example:4222",
		"a.example:4222":               "nats://a.example:4222",
		"tls://user:s3cr3t@a:4222":     "tls://redacted@a:4222",
		"s3cr3t-token@a.example:4222":  "nats://redacted@a.example:4222",
		"nats://s3cr3t%zz@a.example:1": "(unparsable URL)",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// The callout's connections never give up: each reconnects for as long as
// the process lives (a NATS outage of any length ends with the callout
// back), and one that starts before NATS keeps trying.
func TestConnectionsNeverGiveUp(t *testing.T) {
	_, nc := plainServer(t)
	conns, err := connect(t.Context(), ServeConfig{NATSURLs: nc.ConnectedUrl(), Connections: 2}, slog.New(slog.DiscardHandler))
	for _, c := range conns {
		defer c.Close()
	}
	if err != nil || len(conns) != 2 {
		t.Fatalf("connect: %d connections, %v", len(conns), err)
	}
	for i, c := range conns {
		if c.Opts.MaxReconnect >= 0 || !c.Opts.RetryOnFailedConnect {
			t.Fatalf("connection %d: MaxReconnects %d, RetryOnFailedConnect %v; want unlimited and on", i, c.Opts.MaxReconnect, c.Opts.RetryOnFailedConnect)
		}
	}
}
