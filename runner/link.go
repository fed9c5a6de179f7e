package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/subjects"
	"github.com/nats-io/nats.go"
)

// Limits and defaults of the NATS link, each with its reason.
const (
	// DefaultConnectTimeout bounds one dial plus CONNECT handshake, TLS
	// included. It is not the auth callout's budget: nats-server (v2.15)
	// arms a client's first PING, 2 s plus up to 20 %, when it reads the
	// CONNECT and before it asks the callout, and nats.go fails a CONNECT
	// that sees that PING before the authorization answer (IsSlowAuth). So
	// a CONNECT through the callout gets about 2 s whatever the server's
	// authorization timeout says (test/horizon pins this; the callout answers
	// within its --answer-horizon, 1.8 s, or not at all). The timeout stays
	// far above that: it is there for a dial or handshake that hangs, and
	// must never end a CONNECT the server is still deciding.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultReconnectWait and DefaultReconnectJitter spread reconnects after
	// an outage: with thousands of Runners, a fixed wait turns one server
	// restart into synchronized CONNECT waves against the callout. The
	// window is sized for a fleet, not for one Runner: a nats-server
	// authorizes some hundreds of CONNECTs a second through the callout
	// (each costs it a key pair, a signature and a seal, and the answer's
	// opening and two signature checks), and every CONNECT offered beyond
	// that fails at the first PING and comes back. In the reconnect storm
	// (docs/performance.md) 10,000 Runners came back in 45 s with no wasted
	// authorization with a 20 s window, and in 79 s with 4,628 wasted with a
	// 3 s one. A lone Runner pays 2 to 22 s after a blip (--reconnect-jitter).
	DefaultReconnectWait   = 2 * time.Second
	DefaultReconnectJitter = 20 * time.Second
	// DefaultCheckEvery is how often the token source is compared with the
	// token sent at the last CONNECT. A read of a small file every few seconds
	// is cheap, and the kubelet rotates 120 s before expiry, so 5 s leaves
	// almost all of that window for the jittered early reconnect.
	DefaultCheckEvery = 5 * time.Second
	// DefaultRotateJitter is the largest delay before the early reconnect
	// after the token changed: it spreads a fleet whose tokens rotate together
	// (a kubelet restart, a node-pool roll) across half a minute. It is
	// further capped at half the time left on the old token.
	DefaultRotateJitter = 30 * time.Second
	// DrainTimeout bounds a graceful drain of a connection: in-flight commands
	// are short (ReplyTTL is a minute, but ping and info take microseconds);
	// a stuck one must not block shutdown for ever.
	DrainTimeout = 10 * time.Second
	// authLogEvery rate-limits the repeated explanation of one authorization
	// failure while reconnect attempts keep failing for the same reason.
	authLogEvery = time.Minute
	// tokenExpirySlack: a server-side expiry within this of the token's exp
	// is the token's, not the callout's cap (JWT times are whole seconds).
	tokenExpirySlack = 2 * time.Second
	// handoverRetry and handoverRetryMax bound the full-jitter exponential
	// backoff after a failed early reconnect. A failure usually means the
	// callout is saturated (a fleet rotating at once); fixed retries would
	// keep the storm going, and the old connection still works meanwhile.
	handoverRetry    = 2 * time.Second
	handoverRetryMax = time.Minute
	// cmdQueue is the queue group of the command subscription. One Runner
	// has one subscription except during an early reconnect, when the new
	// connection subscribes before the old one drains; the queue group makes
	// each command go to exactly one of the two.
	cmdQueue = "runner"
	// DefaultHandoverOverlap is how long an early reconnect keeps the old
	// session's command subscription after the new one is on the new
	// session's server (its Flush returned), before it drains the old one.
	//
	// The failure it covers: in a NATS cluster each node learns of a
	// subscription on another node over the route from that node (RS+ when
	// the new session subscribes, RS- when the old one's drain unsubscribes),
	// and each route carries it on its own time. When the new session is on
	// another node than the old, a third node can learn that the old
	// subscription is gone before it learns of the new one: a command
	// published there meanwhile finds no subscriber and its requester gets
	// "no responders" at once; one already routed to the old node after the
	// old subscription went is dropped there unless that node knows of the
	// new one (nats-server forwards a routed queue message to another
	// route's member only then). With a route a few milliseconds longer
	// than another (nodes in different zones), a ping every 100 ms lost one
	// command in ten moves (test/cluster TestHandoverToAnotherNodeLosesNoPing).
	// Waiting before the drain lets the new interest reach every node first;
	// during the overlap both subscriptions are members of cmdQueue, so each
	// command is answered exactly once, by either session.
	//
	// Why a bound and not a proof: a Runner may publish only its events (and
	// answer requests it received), so neither of its connections can send a
	// probe that the other answers; proving the interest arrived at the old
	// node would take a publish grant on the Runner's own subjects, and would
	// still say nothing of the third node, whose route from the new node is
	// another one. Route propagation takes microseconds on one host and a few
	// milliseconds across zones; half a second leaves two orders of magnitude
	// for a loaded node or a long route. It stays under kick's
	// MinDuplicateGrace (1 s), the shortest time the callout lets two live
	// connections of one Runner ID overlap before it takes the older for a
	// copy, so a handover with a quick drain is never kicked.
	//
	// It widens no exposure: the old session keeps its subscription at most
	// this much longer, and never past half of what is left of its token or
	// observed user-JWT lifetime (handoverOverlap); a session the callout
	// ends (revocation, duplicate) ends whatever the overlap.
	DefaultHandoverOverlap = 500 * time.Millisecond
)

// LinkEventKind names what happened on the link.
type LinkEventKind string

const (
	EventConnected     LinkEventKind = "connected"      // first connection of the link
	EventReconnected   LinkEventKind = "reconnected"    // nats.go reconnected a session
	EventHandover      LinkEventKind = "handover"       // early reconnect: a new session took over
	EventDisconnected  LinkEventKind = "disconnected"   // a live session lost its connection
	EventAuthError     LinkEventKind = "auth-error"     // the server refused or expired the authorization
	EventSlowAuth      LinkEventKind = "slow-auth"      // a CONNECT failed: the first PING came before the authorization answer (IsSlowAuth)
	EventConnectFailed LinkEventKind = "connect-failed" // a connection attempt failed otherwise: the dial or the handshake
	EventClosed        LinkEventKind = "closed"         // the link drained and closed
)

// LinkEvent is one link event, for tests and metrics.
type LinkEvent struct {
	Kind    LinkEventKind
	At      time.Time
	Session int // session number (1 for the first connection)
	Err     error
	// Took is, for EventHandover, the time from the start of the early
	// reconnect to the new connection serving (dial, CONNECT through the
	// callout, subscribe, flush). The overlap that follows, before the old
	// connection drains and the event is emitted, is not in it.
	Took time.Duration
}

// LinkConfig configures a Link.
type LinkConfig struct {
	URL      string
	RunnerID string
	Name     string // client name shown by the server (default compass-runner/<id>)
	Tokens   TokenSource
	// Handler serves the command subject. It runs on the subscription's
	// goroutine; a drain waits for it.
	Handler nats.MsgHandler
	// Options are extra nats.go options (TLS roots, ...).
	Options []nats.Option
	// AllowPlaintext lets the link send the token without TLS to a NATS
	// server that is not on loopback (Config.AllowPlaintextNATS). Without it
	// such a dial is refused, whether the URL was configured or learned from
	// a server's INFO (see plaintextGuard).
	AllowPlaintext bool

	ConnectTimeout  time.Duration
	ReconnectWait   time.Duration
	ReconnectJitter time.Duration
	// MaxReconnectJitter caps the jitter window, which doubles after each
	// failed reconnect attempt in a row (see ReconnectDelay).
	MaxReconnectJitter time.Duration
	CheckEvery         time.Duration
	RotateJitter       time.Duration
	// Refresh, when set, reconnects early this often after each connect so a
	// fresh user JWT replaces the old before the server expires it. Set it
	// below the callout's maximum user-JWT lifetime when that is shorter than
	// the token's. Zero: only when the token changes (and the link learns the
	// lifetime from the first expiry the server reports).
	Refresh time.Duration
	// HandoverOverlap is how long an early reconnect keeps the old session's
	// command subscription once the new one is in place, so that every node
	// of a NATS cluster learns of the new before the old goes (default
	// DefaultHandoverOverlap).
	HandoverOverlap time.Duration

	Logger  *slog.Logger
	Now     func() time.Time
	Jitter  func(max time.Duration) time.Duration // uniform in [0, max); default math/rand/v2
	OnEvent func(LinkEvent)                       // must not block
}

// Link is the Runner's NATS connection. It authenticates every CONNECT with
// the current token, reconnects for ever with jitter, and reconnects early
// (a new connection subscribes before the old drains, so no command is lost)
// when the token changes or the user JWT is about to expire.
type Link struct {
	cfg    LinkConfig
	log    *slog.Logger
	cmd    string
	inbox  string
	nextID atomic.Int64
	guard  *plaintextGuard // nil: every dial is sealed by TLS, or plaintext is allowed

	mu      sync.Mutex
	cur     *session
	retired []*session

	learned      atomic.Int64 // observed user-JWT lifetime in ns (0: unknown)
	handovers    atomic.Int64
	reconnects   atomic.Int64
	authRefusals atomic.Int64
	slowAuths    atomic.Int64

	authMu      sync.Mutex
	lastAuthMsg string
	lastAuthLog time.Time
	lastSlowLog time.Time
}

type session struct {
	id          int
	nc          *nats.Conn
	conn        atomic.Pointer[nats.Conn] // nc, for nats.go's callbacks, which may run before nc is set
	sub         *nats.Subscription
	sent        atomic.Pointer[string] // token sent at the last CONNECT
	connectedAt atomic.Int64           // unix ns of the last (re)connect
	retired     atomic.Bool            // being drained after a handover or shutdown
	closed      chan struct{}
	up          chan struct{} // closed at the first connect
	upOnce      sync.Once
}

// NewLink checks cfg and returns a Link; Run connects it.
func NewLink(cfg LinkConfig) (*Link, error) {
	if cfg.Tokens == nil {
		return nil, errors.New("runner: link: no token source")
	}
	if cfg.URL == "" {
		return nil, errors.New("runner: link: no NATS URL")
	}
	if cfg.Handler == nil {
		return nil, errors.New("runner: link: no command handler")
	}
	cmd, err := subjects.Command(cfg.RunnerID)
	if err != nil {
		return nil, fmt.Errorf("runner: link: %w", err)
	}
	inbox, _ := subjects.InboxPrefix(cfg.RunnerID)
	if cfg.Name == "" {
		cfg.Name = "compass-runner/" + cfg.RunnerID
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.ConnectTimeout, DefaultConnectTimeout)
	def(&cfg.ReconnectWait, DefaultReconnectWait)
	def(&cfg.ReconnectJitter, DefaultReconnectJitter)
	def(&cfg.MaxReconnectJitter, max(DefaultMaxReconnectJitter, cfg.ReconnectJitter))
	def(&cfg.CheckEvery, DefaultCheckEvery)
	def(&cfg.RotateJitter, DefaultRotateJitter)
	def(&cfg.HandoverOverlap, DefaultHandoverOverlap)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Jitter == nil {
		cfg.Jitter = func(max time.Duration) time.Duration {
			if max <= 0 {
				return 0
			}
			return time.Duration(rand.Int64N(int64(max)))
		}
	}
	l := &Link{cfg: cfg, log: cfg.Logger.With("runner_id", cfg.RunnerID), cmd: cmd, inbox: inbox}
	l.guard = newPlaintextGuard(cfg, l.log)
	return l, nil
}

// Status is a snapshot of the link for info and readiness.
type Status struct {
	Connected   bool
	ServerURL   string
	ServerID    string
	ConnectedAt time.Time
	Session     int
	Handovers   int64
	Reconnects  int64
	// AuthRefusals counts CONNECTs the server or its auth callout refused;
	// SlowAuths, apart from them, CONNECTs that failed because the server's
	// first PING came before any authorization answer (IsSlowAuth).
	AuthRefusals int64
	SlowAuths    int64
}

// Status reports the current session.
func (l *Link) Status() Status {
	l.mu.Lock()
	s := l.cur
	l.mu.Unlock()
	st := Status{Handovers: l.handovers.Load(), Reconnects: l.reconnects.Load(),
		AuthRefusals: l.authRefusals.Load(), SlowAuths: l.slowAuths.Load()}
	if s == nil {
		return st
	}
	st.Session = s.id
	st.Connected = s.nc.IsConnected()
	if st.Connected {
		st.ServerURL = s.nc.ConnectedUrlRedacted()
		st.ServerID = s.nc.ConnectedServerId()
		st.ConnectedAt = time.Unix(0, s.connectedAt.Load())
	}
	return st
}

// Connected reports whether the current session is connected.
func (l *Link) Connected() bool { return l.Status().Connected }

// Publish publishes on the current session (buffered by nats.go while it reconnects).
func (l *Link) Publish(subject string, data []byte) error {
	l.mu.Lock()
	s := l.cur
	l.mu.Unlock()
	if s == nil {
		return errors.New("runner: link: not started")
	}
	if err := s.nc.Publish(subject, data); err != nil {
		return fmt.Errorf("runner: publish: %w", err)
	}
	return nil
}

func (l *Link) emit(kind LinkEventKind, s *session, err error) {
	if l.cfg.OnEvent != nil {
		l.cfg.OnEvent(LinkEvent{Kind: kind, At: l.cfg.Now(), Session: s.id, Err: err})
	}
}

// Run connects and keeps the link until ctx ends, then drains the command
// subscription (finishing in-flight commands) and closes. The first connect
// is retried for ever in the background: Run returns only on ctx's end or a
// configuration error.
func (l *Link) Run(ctx context.Context) error {
	s, err := l.dial(true)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.cur = s
	l.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		// Connected means the command subscription is on the server: wait for
		// the (possibly retried) first connect, then a round trip.
		defer wg.Done()
		select {
		case <-ctx.Done():
			return
		case <-s.up:
		}
		if err := s.nc.Flush(); err != nil {
			l.log.Warn("runner: NATS flush after connect", "err", err)
		}
		l.emit(EventConnected, s, nil)
	}()

	check := time.NewTicker(l.cfg.CheckEvery)
	defer check.Stop()
	rotate := time.NewTimer(time.Hour)
	rotate.Stop()
	var rotateAt time.Time // zero: no early reconnect planned
	failures := 0          // consecutive failed early reconnects
	plan := func(at time.Time, why string) {
		if !rotateAt.IsZero() && !at.Before(rotateAt) {
			return
		}
		rotateAt = at
		d := at.Sub(l.cfg.Now())
		rotate.Reset(max(d, 0))
		l.log.Debug("runner: early reconnect planned", "in", d.Round(time.Millisecond), "why", why)
	}
	for {
		select {
		case <-ctx.Done():
			rotate.Stop()
			l.shutdown()
			return nil
		case <-check.C:
			if !rotateAt.IsZero() {
				continue
			}
			if at, why, ok := l.due(s); ok {
				plan(at, why)
			}
		case <-rotate.C:
			rotateAt = time.Time{}
			ns, err := l.handover(ctx, s)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				wait := l.cfg.Jitter(min(handoverRetryMax, handoverRetry<<min(failures, 5)))
				failures++
				l.log.Warn("runner: early reconnect failed; keeping the current connection", "err", err, "attempt", failures, "retry_in", wait.Round(time.Millisecond))
				plan(l.cfg.Now().Add(wait), "retry")
				continue
			}
			failures = 0
			s = ns
		}
	}
}

// due decides whether the current session should be replaced early, and when.
func (l *Link) due(s *session) (time.Time, string, bool) {
	if !s.nc.IsConnected() {
		return time.Time{}, "", false // nats.go is reconnecting with the current token
	}
	now := l.cfg.Now()
	tok, err := l.cfg.Tokens.Token()
	if sent := s.sent.Load(); err == nil && sent != nil && tok != *sent {
		// Jitter within half of what is left of the old token, so the new
		// user JWT is in place before the old one (capped at the token's exp)
		// expires.
		window := l.cfg.RotateJitter
		if exp, ok := TokenExpiry(*sent); ok {
			window = min(window, exp.Sub(now)/2)
		}
		return now.Add(l.cfg.Jitter(window)), "token changed", true
	}
	period := l.cfg.Refresh
	if learned := time.Duration(l.learned.Load()); learned > 0 && (period == 0 || learned < period) {
		period = learned
	}
	if at := s.connectedAt.Load(); period > 0 && at > 0 {
		// Between 70 % and 90 % of the period after the connect.
		start := time.Unix(0, at).Add(period * 7 / 10)
		at := start.Add(l.cfg.Jitter(period / 5))
		if at.Before(now) {
			at = now
		}
		return at, "user JWT refresh", true
	}
	return time.Time{}, "", false
}

// handover opens a new session with the current token, subscribes, keeps
// both subscriptions for the overlap (see DefaultHandoverOverlap), and only
// then drains the old session: commands the old one already received are
// answered on it while its user JWT is still valid.
func (l *Link) handover(ctx context.Context, old *session) (*session, error) {
	start := l.cfg.Now()
	ns, err := l.dial(false)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		ns.retired.Store(true)
		ns.nc.Close()
		return nil, err
	}
	took := l.cfg.Now().Sub(start)
	l.mu.Lock()
	l.cur = ns
	kept := l.retired[:0]
	for _, r := range l.retired {
		select {
		case <-r.closed: // drained: forget it
		default:
			kept = append(kept, r)
		}
	}
	// Listed now, so that a shutdown during the overlap waits for it too.
	l.retired = append(kept, old)
	l.mu.Unlock()
	overlap := l.handoverOverlap(old)
	if overlap > 0 {
		wait := time.NewTimer(overlap)
		select {
		case <-wait.C:
		case <-ctx.Done(): // shutting down: drain now
		case <-old.closed:
		}
		wait.Stop()
	}
	l.retire(old)
	l.handovers.Add(1)
	l.log.Info("runner: reconnected early with the current token", "session", ns.id, "server", ns.nc.ConnectedUrlRedacted(), "took", took, "overlap", overlap)
	if l.cfg.OnEvent != nil {
		l.cfg.OnEvent(LinkEvent{Kind: EventHandover, At: l.cfg.Now(), Session: ns.id, Took: took})
	}
	return ns, nil
}

// handoverOverlap is how long old keeps its subscription beside the new
// session's: none when old is not connected (nats.go is reconnecting it: it
// has no subscription to keep), else overlapWithin.
func (l *Link) handoverOverlap(old *session) time.Duration {
	if old.nc == nil || !old.nc.IsConnected() {
		return 0
	}
	return overlapWithin(l.cfg.HandoverOverlap, l.cfg.Now(), old.sent.Load(), old.connectedAt.Load(), time.Duration(l.learned.Load()))
}

// overlapWithin is overlap, but at most half of what is left at now of a
// session's authorization as far as the link knows it: the exp of the token
// it sent (sent, when known), and its connect (unix ns, 0: unknown) plus the
// user-JWT lifetime observed from a server-side expiry (learned, 0:
// unknown). So the server does not expire the old session during the
// overlap, which would cost a reconnect through the callout for nothing.
func overlapWithin(overlap time.Duration, now time.Time, sent *string, connectedAt int64, learned time.Duration) time.Duration {
	if sent != nil {
		if exp, ok := TokenExpiry(*sent); ok {
			overlap = min(overlap, exp.Sub(now)/2)
		}
	}
	if learned > 0 && connectedAt > 0 {
		overlap = min(overlap, time.Unix(0, connectedAt).Add(learned).Sub(now)/2)
	}
	return max(overlap, 0)
}

func (l *Link) retire(s *session) {
	s.retired.Store(true)
	if err := s.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.nc.Close()
	}
}

// shutdown drains the current session (in-flight commands finish, replies are
// flushed) and waits for every session to close, bounded by DrainTimeout.
func (l *Link) shutdown() {
	l.mu.Lock()
	all := append(append([]*session(nil), l.retired...), l.cur)
	cur := l.cur
	l.mu.Unlock()
	l.retire(cur)
	deadline := time.NewTimer(DrainTimeout + time.Second)
	defer deadline.Stop()
	for _, s := range all {
		select {
		case <-s.closed:
		case <-deadline.C:
			l.log.Warn("runner: drain did not finish in time; closing")
			for _, s := range all {
				s.nc.Close()
			}
			return
		}
	}
	l.log.Info("runner: NATS connection drained and closed")
	l.emit(EventClosed, cur, nil)
}

// dial opens one session. The first one retries in the background until it
// connects (a Runner starts before NATS is reachable); an early reconnect
// must connect now or keep the old session.
func (l *Link) dial(first bool) (*session, error) {
	s := &session{id: int(l.nextID.Add(1)), closed: make(chan struct{}), up: make(chan struct{})}
	delay := ReconnectDelay(l.cfg.ReconnectWait, l.cfg.ReconnectJitter, l.cfg.MaxReconnectJitter)
	opts := []nats.Option{
		nats.Name(l.cfg.Name),
		nats.TokenHandler(func() string { return l.token(s) }),
		nats.CustomInboxPrefix(l.inbox),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(func(attempts int) time.Duration {
			d := delay(attempts)
			// nats.go reports no error for a reconnect attempt whose CONNECT
			// failed after the dial (its ReconnectErrHandler sees dial errors,
			// its ErrorHandler refusals); that error stays the connection's
			// last one until the next attempt, which this delay precedes.
			if nc := s.conn.Load(); nc != nil && attempts > 1 {
				if err := nc.LastError(); IsSlowAuth(err) {
					l.slowAuth(s, err, d)
				}
			}
			return d
		}),
		nats.IgnoreAuthErrorAbort(),
		nats.Timeout(l.cfg.ConnectTimeout),
		nats.DrainTimeout(DrainTimeout),
		nats.RetryOnFailedConnect(first),
		nats.ConnectHandler(func(nc *nats.Conn) {
			s.connectedAt.Store(l.cfg.Now().UnixNano())
			l.log.Info("runner: NATS connected", "session", s.id, "server", nc.ConnectedUrlRedacted(), "server_id", nc.ConnectedServerId())
			s.upOnce.Do(func() { close(s.up) })
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			s.connectedAt.Store(l.cfg.Now().UnixNano())
			l.reconnects.Add(1)
			l.log.Info("runner: NATS reconnected", "session", s.id, "server", nc.ConnectedUrlRedacted(), "server_id", nc.ConnectedServerId())
			l.emit(EventReconnected, s, nil)
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if s.retired.Load() {
				return
			}
			l.log.Warn("runner: NATS disconnected; reconnecting", "session", s.id, "err", err)
			l.emit(EventDisconnected, s, err)
		}),
		nats.ReconnectErrHandler(func(nc *nats.Conn, err error) {
			// Besides dial errors: the first connect's own failure, when it
			// is retried in the background.
			if isAuthErr(err) {
				l.explainAuth(s, err)
				return
			}
			if IsSlowAuth(err) {
				l.slowAuth(s, err, 0)
				return
			}
			l.log.Debug("runner: NATS reconnect attempt failed", "session", s.id, "err", err)
			l.emit(EventConnectFailed, s, err)
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if isAuthErr(err) {
				l.explainAuth(s, err)
				return
			}
			l.log.Warn("runner: NATS error", "session", s.id, "err", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(s.closed) }),
	}
	// After the options: a TLS configuration they set gets the name too.
	opts = append(append(opts, l.cfg.Options...), natsurl.TLSServerName(l.cfg.URL))
	if l.guard != nil {
		// After the options: it wraps the dialer they set.
		opts = append(opts, nats.SetCustomDialer(l.guard))
	}
	nc, err := nats.Connect(l.cfg.URL, opts...)
	if err != nil {
		switch {
		case isAuthErr(err):
			l.explainAuth(s, err)
		case IsSlowAuth(err):
			l.slowAuth(s, err, 0)
		default:
			l.emit(EventConnectFailed, s, err)
		}
		return nil, fmt.Errorf("runner: connect to NATS: %w", err)
	}
	s.nc = nc
	s.conn.Store(nc)
	if !first {
		s.connectedAt.Store(l.cfg.Now().UnixNano())
	}
	s.sub, err = nc.QueueSubscribe(l.cmd, cmdQueue, l.cfg.Handler)
	if err == nil && !first {
		// The new subscription must be on the server before the old drains.
		err = nc.Flush()
	}
	if err != nil {
		s.retired.Store(true)
		nc.Close()
		return nil, fmt.Errorf("runner: subscribe %s: %w", l.cmd, err)
	}
	return s, nil
}

// token is the TokenHandler: the current token, remembered per session so a
// change can be detected. On failure CONNECT carries no token and the server
// refuses it; explainAuth then says why.
func (l *Link) token(s *session) string {
	tok, err := l.cfg.Tokens.Token()
	if err != nil {
		// The token source logs each failure episode and explainAuth says
		// why the CONNECT was refused; every attempt need not repeat it.
		l.log.Debug("runner: no token for NATS CONNECT", "err", err)
		return ""
	}
	s.sent.Store(&tok)
	return tok
}
