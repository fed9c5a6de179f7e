package callout

// The callout's NATS connections: spread over the configured servers, learning
// the cluster's other servers from INFO, and retried in the background while
// no server is up.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/natsurl"
)

// splitURLs reads a comma-separated URL list the way nats.go does (spaces
// trimmed, empty entries skipped).
func splitURLs(list string) []string {
	var urls []string
	for _, u := range strings.Split(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

// spread is the server list of connection i of the callout: it starts at URL
// i mod len(urls) and goes on to the others in an order nats.go randomizes.
// A node's loss then costs the callout at most the connections that started
// there (about Connections/len(urls)), and those reconnect to the survivors
// at random rather than all onto the next node in the list.
func spread(urls []string, i int) (first string, rest []string) {
	k := i % len(urls)
	first = urls[k]
	rest = append(append(rest, urls[k+1:]...), urls[:k]...)
	return first, rest
}

// spreader keeps the callout's connections apart when a node goes: each
// reconnects to the server that holds the fewest of the others.
//
// Without it nats.go reconnects to the next server of its pool, and over a
// NATS cluster's roll (every node restarted in turn) the connections pile up
// on one node: the last node to restart then takes them all, and for the
// moment they take to resubscribe elsewhere the survivors know no callout at
// all, so the CONNECTs of that node's Runners, which reconnect just as fast,
// are published to no one and fail after the server's auth timeout (an
// authorization error). Kept apart, every surviving node holds a callout
// subscription of its own when another node goes, and nats-server hands a
// request to a local queue subscriber first.
type spreader struct {
	mu sync.Mutex
	// on is the host:port of the server each connection is on, or is
	// reconnecting to (so that connections lost together do not all pick
	// the same server); lost the one a reconnecting connection lost.
	on, lost map[int]string
}

func newSpreader() *spreader { return &spreader{on: map[int]string{}, lost: map[int]string{}} }

func (sp *spreader) connected(i int, nc *nats.Conn) {
	host := ""
	if u, err := url.Parse(nc.ConnectedUrl()); err == nil {
		host = u.Host
	}
	sp.mu.Lock()
	sp.on[i] = host
	delete(sp.lost, i)
	sp.mu.Unlock()
}

// reconnect is connection i's nats.ReconnectToServerHandler, called before
// each attempt of a reconnect.
func (sp *spreader) reconnect(i int) nats.ReconnectToServerHandler {
	return func(pool []nats.Server, _ nats.ServerInfo) (*nats.Server, time.Duration) {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		if _, out := sp.lost[i]; !out {
			sp.lost[i] = sp.on[i]
		}
		j := leastUsed(pool, sp.lost[i], sp.on, i, rand.IntN(max(len(pool), 1)))
		if j < 0 {
			return nil, 0 // nats.go's own order and waits
		}
		sp.on[i] = pool[j].URL.Host
		return &pool[j], 0
	}
}

// leastUsed is the server of pool that the fewest connections other than
// self are on, among those not yet tried in this outage (no failed attempt
// since their last connect) other than lost, the one self was on; ties go to
// the first met from start on. -1 when none is left: every other server
// failed once, and nats.go's own order, with its waits, takes over.
func leastUsed(pool []nats.Server, lost string, on map[int]string, self, start int) int {
	best, bestN := -1, 0
	for k := range pool {
		j := (start + k) % len(pool)
		s := pool[j]
		if s.URL == nil || s.URL.Host == lost || s.Reconnects > 0 {
			continue
		}
		n := 0
		for c, host := range on {
			if c != self && host == s.URL.Host {
				n++
			}
		}
		if best < 0 || n < bestN {
			best, bestN = j, n
		}
	}
	return best
}

// connect opens cfg.Connections NATS connections as the callout user, spread
// over the configured URLs (see spread). Each learns the cluster's other
// servers from the INFO it receives (nats.go's default, left on), so a
// single URL suffices for reconnects to reach the other nodes. When no server
// is up the connections keep retrying in the background (a callout may start
// before NATS, or with it in the same roll), and for ever after any failure,
// refused credentials included (internal/lib/natsretry: a key or password change
// made in the wrong order heals once it is completed, with no restart);
// connect returns once every
// connection is up, or with an error when ctx ends first. It returns the
// connections it opened, even on error, for the caller to close.
func connect(ctx context.Context, cfg ServeConfig, nm *natsretry.Metrics, log *slog.Logger) ([]*nats.Conn, error) {
	urls := splitURLs(cfg.NATSURLs)
	if len(urls) == 0 {
		return nil, configErr("--nats-url: no NATS URL")
	}
	// nats.go's errors for a URL that does not parse quote it, credentials
	// and all: refuse it here, by its position.
	if err := natsurl.CheckParse(cfg.NATSURLs); err != nil {
		return nil, configErr("--nats-url: %v", err)
	}
	var auth nats.Option
	switch {
	case cfg.NATSCreds != "":
		auth = nats.UserCredentials(cfg.NATSCreds)
	case cfg.NATSNkeyFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNkeyFile)
		if err != nil {
			return nil, fmt.Errorf("callout: --nats-nkey: %w", err)
		}
		auth = o
	case cfg.NATSUser != "":
		auth = nats.UserInfo(cfg.NATSUser, cfg.NATSPassword)
	}

	var conns []*nats.Conn
	var watches []*natsretry.Watch
	sp := newSpreader()
	waiting := 0
	ups := make([]chan struct{}, cfg.Connections)
	for i := range cfg.Connections {
		up := make(chan struct{})
		ups[i] = up
		var once sync.Once
		w := nm.Watch(fmt.Sprintf("responder-%d", i), natsretry.Config{
			Prefix: "callout", Attrs: []any{"connection", i}, Logger: log,
			OnConnect: func(nc *nats.Conn, _ bool) {
				sp.connected(i, nc)
				once.Do(func() { close(up) })
			},
		})
		watches = append(watches, w)
		opts := append([]nats.Option{nats.Name("compass-callout"), nats.ReconnectToServer(sp.reconnect(i))}, w.Options()...)
		if auth != nil {
			opts = append(opts, auth)
		}
		if cfg.NATSCAFile != "" {
			opts = append(opts, nats.RootCAs(cfg.NATSCAFile))
		}
		opts = append(opts, natsurl.TLSServerName(cfg.NATSURLs))
		o := nats.GetDefaultOptions()
		for _, opt := range opts {
			if err := opt(&o); err != nil {
				return conns, fmt.Errorf("callout: NATS connection %d: %w", i, err)
			}
		}
		// nats.go tries Url first, then Servers in random order.
		o.Url, o.Servers = spread(urls, i)
		nc, err := o.Connect()
		if err != nil {
			return conns, fmt.Errorf("callout: NATS connection %d: %w", i, err)
		}
		watches[i].Bind(nc)
		conns = append(conns, nc)
		if !nc.IsConnected() {
			waiting++
		}
	}
	if waiting > 0 {
		log.Warn("callout: no NATS server reachable yet; retrying in the background until one is (Runners are refused until the callout connects)",
			"connections_waiting", waiting, "urls", natsurl.Redact(cfg.NATSURLs))
	}
	for i, up := range ups {
		select {
		case <-up:
		case <-ctx.Done():
			return conns, fmt.Errorf("callout: NATS connection %d: stopped before any NATS server was reachable: %w", i, ctx.Err())
		}
	}
	return conns, nil
}
