package runner

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/nats-io/nats.go"
)

// plaintextGuard keeps the token off the network in clear text when the
// cluster tells the link about other servers. nats.go adds every server a
// server's INFO advertises (connect_urls, the cluster's other nodes) to the
// pool, with the scheme of the connection: tls:// when any configured URL is
// tls:// or wss:// (or an option such as RootCAs asks for TLS), and then
// every connection, to a configured or a learned server, does TLS or fails;
// nats:// otherwise. So a link configured with nats:// to loopback (which
// natsurl.CheckSealed lets through) would, on a reconnect, send the token in
// clear text to whatever non-loopback address the cluster advertises. The
// attacker is anyone on that path, or anyone able to make a server advertise
// an address (a node in the cluster, a forged route). When the pool is not
// sealed by TLS and plaintext is not allowed, the guard is the link's dialer:
// it refuses any address nats.go resolved to a non-loopback host and lets
// loopback through to the dialer the options configured (or a plain one).
type plaintextGuard struct {
	inner nats.CustomDialer
	log   *slog.Logger
	now   func() time.Time

	mu     sync.Mutex
	logged map[string]time.Time // refused address -> last log
}

// newPlaintextGuard returns the guard cfg needs, or nil when every
// connection of the link does TLS or plaintext is allowed.
func newPlaintextGuard(cfg LinkConfig, log *slog.Logger) *plaintextGuard {
	if cfg.AllowPlaintext {
		return nil
	}
	// The options as nats.go will see them: what they set (Secure, a dialer)
	// decides as much as the URLs. An option that fails here fails again,
	// with its error, in nats.Connect.
	o := nats.GetDefaultOptions()
	for _, opt := range cfg.Options {
		if opt != nil {
			_ = opt(&o)
		}
	}
	if o.Secure || o.TLSHandshakeFirst {
		return nil
	}
	for _, u := range strings.Split(cfg.URL, ",") {
		u = strings.ToLower(strings.TrimSpace(u))
		if strings.HasPrefix(u, "tls://") || strings.HasPrefix(u, "wss://") {
			return nil
		}
	}
	inner := o.CustomDialer
	if inner == nil {
		if o.Dialer != nil {
			inner = o.Dialer
		} else {
			inner = &net.Dialer{Timeout: cfg.ConnectTimeout}
		}
	}
	return &plaintextGuard{inner: inner, log: log, now: cfg.Now, logged: map[string]time.Time{}}
}

// Dial is nats.CustomDialer's: addr is what nats.go dials, an IP address
// when the URL's host name resolved, else the name.
func (g *plaintextGuard) Dial(network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if natsurl.Loopback(host) {
		return g.inner.Dial(network, addr)
	}
	now := g.now()
	g.mu.Lock()
	last, seen := g.logged[addr]
	if !seen || now.Sub(last) >= authLogEvery {
		g.logged[addr] = now
		g.log.Warn("runner: not connecting to a NATS server the cluster advertised: without TLS the token would cross the network in clear text (connect with tls://, or --allow-plaintext-nats)", "addr", addr)
	}
	g.mu.Unlock()
	return nil, fmt.Errorf("runner: not dialing %s: %w", addr, natsurl.ErrPlaintext)
}
