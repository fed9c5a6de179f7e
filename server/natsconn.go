package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/subjects"
)

// NATSConfig is how the Server connects to NATS. In server-config callout
// mode the Server is one of the callout's auth_users (a user and password in
// the nats-server config); in operator mode it uses a credentials file.
type NATSConfig struct {
	// URL is one or more NATS URLs, comma-separated. Any one suffices to
	// reach a cluster: the connection learns the other nodes from the INFO
	// each server sends (nats.go's default, left on) and reconnects to them
	// when its node goes.
	URL      string
	User     string
	Password string // from a file or the environment, never a flag value
	Creds    string // credentials file (operator mode)
	CAFile   string // PEM CA for a TLS NATS server
	Name     string // client name shown by nats-server
}

// natsReconnectWait is the least wait between two rounds of the Server's
// reconnect attempts (natsretry adds a jitter that doubles with each failed
// round, up to natsretry.DefaultMaxJitter); it is one process, so there is
// no fleet to spread, but a tight loop would flood the log during an outage.
const natsReconnectWait = 2 * time.Second

// natsDrainTimeout bounds the drain at shutdown: in-flight event handlers
// are single last_seen writes (touchTimeout each).
const natsDrainTimeout = 2 * touchTimeout

// connectNATS connects (retrying in the background when no server is up
// yet, so serve starts either way, and saying so once), retries for ever
// after any failure, refused credentials included (internal/lib/natsretry: the
// cause at ERROR, compass_server_nats_connect_failures_total by cause), and
// logs connection changes. closed is closed once the connection is closed
// for good (after a drain).
func connectNATS(cfg NATSConfig, nm *natsretry.Metrics, log *slog.Logger, closed chan<- struct{}) (*nats.Conn, error) {
	if cfg.User != "" && cfg.Creds != "" {
		return nil, errors.New("server: nats: set either a user (--nats-user) or a credentials file (--nats-creds), not both")
	}
	w := nm.Watch("server", natsretry.Config{
		Prefix: "server", Logger: log, Wait: natsReconnectWait,
		OnAsyncError: func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("server: NATS error", "error", err) },
	})
	opts := append([]nats.Option{
		nats.Name(cfg.Name),
		nats.DrainTimeout(natsDrainTimeout),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.DiscoveredServersHandler(func(nc *nats.Conn) {
			log.Info("server: nats cluster servers learned", "servers", strings.Join(nc.DiscoveredServers(), ","))
		}),
	}, w.Options()...)
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.Creds != "" {
		opts = append(opts, nats.UserCredentials(cfg.Creds))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	opts = append(opts, natsurl.TLSServerName(cfg.URL))
	nc, err := nats.Connect(cfg.URL, opts...)
	if urlErr := (*url.Error)(nil); errors.As(err, &urlErr) {
		// url.Parse's error quotes the whole URL, credentials included.
		return nil, fmt.Errorf("server: nats connect: --nats-url %s: a URL does not parse", natsurl.Redact(cfg.URL))
	}
	if err != nil {
		return nil, fmt.Errorf("server: nats connect: %w", err)
	}
	w.Bind(nc)
	if !nc.IsConnected() {
		log.Warn("server: no NATS server reachable yet; retrying in the background (commands to Runners and last_seen wait for it)",
			"urls", natsurl.Redact(cfg.URL), "retry_wait", natsReconnectWait, "retry_wait_max", natsReconnectWait+natsretry.DefaultMaxJitter)
	}
	return nc, nil
}

// Toucher advances a Runner's last_seen time. store.Store satisfies it.
type Toucher interface {
	TouchRunner(ctx context.Context, runnerID string, at time.Time) error
}

// TouchEvery is the least time between two last_seen writes for one Runner.
// Runners publish events as often as they like; last_seen is for operators
// ("seen a minute ago"), so one write per Runner per 30 s bounds database
// writes to the fleet size, not the event rate.
const TouchEvery = 30 * time.Second

// touchTimeout bounds one last_seen write, so a stuck database cannot stall
// the event subscription for ever.
const touchTimeout = 5 * time.Second

// LastSeen keeps Runners' last_seen from their events.
type LastSeen struct {
	store Toucher
	now   func() time.Time
	log   *slog.Logger

	mu   sync.Mutex
	last map[string]time.Time // Runner ID -> last write
}

// NewLastSeen returns a LastSeen writing to st.
func NewLastSeen(st Toucher, now func() time.Time, log *slog.Logger) *LastSeen {
	if now == nil {
		now = time.Now
	}
	return &LastSeen{store: st, now: now, log: log, last: map[string]time.Time{}}
}

// Subscribe subscribes to every Runner's events until ctx ends.
func (l *LastSeen) Subscribe(ctx context.Context, nc *nats.Conn) error {
	sub, err := nc.Subscribe(subjects.AllEvents, func(m *nats.Msg) { l.Seen(ctx, m.Subject) })
	if err != nil {
		return fmt.Errorf("server: subscribe %s: %w", subjects.AllEvents, err)
	}
	go func() {
		<-ctx.Done()
		_ = sub.Unsubscribe()
	}()
	return nil
}

// Seen records an event on subject, writing last_seen at most once per
// TouchEvery per Runner. It reports whether it wrote.
func (l *LastSeen) Seen(ctx context.Context, subject string) bool {
	id, ok := subjects.RunnerIDFromSubject(subject)
	if !ok {
		return false
	}
	now := l.now()
	l.mu.Lock()
	if prev, ok := l.last[id]; ok && now.Sub(prev) < TouchEvery {
		l.mu.Unlock()
		return false
	}
	l.last[id] = now
	l.mu.Unlock()
	tctx, cancel := context.WithTimeout(ctx, touchTimeout)
	defer cancel()
	err := l.store.TouchRunner(tctx, id, now)
	switch {
	case errors.Is(err, store.ErrNotFound):
		l.log.Debug("server: event from a Runner that never enrolled", "runner_id", id)
	case err != nil:
		l.log.Warn("server: last_seen write failed", "runner_id", id, "err", err)
		l.mu.Lock()
		delete(l.last, id) // retry on the next event
		l.mu.Unlock()
		return false
	}
	return err == nil
}
