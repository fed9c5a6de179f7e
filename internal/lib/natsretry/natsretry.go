// Package natsretry keeps a daemon's NATS connection retrying for ever.
//
// nats.go closes a connection for good in two cases a daemon must never hit:
// after MaxReconnects attempts (60 by default), and after the same
// authorization error twice in a row from one server. The second is what an
// operator's key or password change made in the wrong order looks like: the
// servers refuse the daemon for a while, the change is then completed, and a
// connection that gave up stays closed until someone restarts the pod. A
// Watch's options turn both off, back off with capped jitter between rounds,
// and say why every failed attempt failed, at ERROR, in the server's words
// ("nats: authorization violation"), with a callback for the metric that
// names the connection that is down.
//
// nats.go reports a failed dial to the ReconnectErrHandler, but an attempt
// refused after the dial (an authorization error) only to the ErrorHandler,
// and only on a reconnect: while the first connect is retried in the
// background it reaches no handler and stays the connection's LastError until
// the next attempt. A Watch counts dial errors from the ReconnectErrHandler,
// a reconnect's refusals from the ErrorHandler (each one, whichever attempt
// of a round it was), and before each wait the round's last error from
// LastError when no handler saw it.
package natsretry

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsurl"
)

// Defaults of a Watch's backoff. A daemon is one process (or a handful of
// replicas), not a fleet, so the jitter only keeps replicas apart; the cap
// bounds how long a fixed fault stays unnoticed by the daemon: at most
// DefaultWait+DefaultMaxJitter after the servers accept it again.
const (
	// DefaultWait is the least wait between two rounds of attempts (a round
	// tries every server the connection knows).
	DefaultWait = time.Second
	// DefaultJitter is the first round's random extra wait; the window
	// doubles with every failed round up to DefaultMaxJitter.
	DefaultJitter = 500 * time.Millisecond
	// DefaultMaxJitter caps the window: a daemon retries at least every
	// DefaultWait+DefaultMaxJitter (9 s), so once a fault is fixed it is
	// back within seconds, and an outage of hours logs a few hundred lines,
	// not a flood.
	DefaultMaxJitter = 8 * time.Second
	// LogEvery is how often the same failure is logged again while it
	// lasts; a new cause is logged at once.
	LogEvery = time.Minute
)

// Failure causes, the values of the Config.OnFailure argument and of the
// daemons' connect-failure metrics.
const (
	CauseAuthorization = "authorization_refused" // the server refused the credentials
	CauseNetwork       = "network"               // no server answered, or a dial or TLS handshake failed
)

// Config describes one connection.
type Config struct {
	// Prefix begins every log message ("callout", "server").
	Prefix string
	// Attrs name the connection in every log record ("connection", "kick").
	Attrs []any
	// Logger receives the records; nil discards them.
	Logger *slog.Logger
	// Wait, Jitter and MaxJitter are the backoff (see Delay); zero takes the
	// defaults.
	Wait, Jitter, MaxJitter time.Duration
	// Now is the clock of the log's rate limit; nil is time.Now.
	Now func() time.Time
	// OnConnect is called after the first connect and after each reconnect,
	// with the connection up.
	OnConnect func(nc *nats.Conn, reconnected bool)
	// OnDisconnect is called when an established connection is lost.
	OnDisconnect func(nc *nats.Conn, err error)
	// OnFailure is called once per failed attempt with its cause
	// (CauseAuthorization or CauseNetwork).
	OnFailure func(cause string)
	// OnAsyncError receives the errors the connection reports that are not
	// connect failures (a slow consumer, a permission violation); nil logs
	// them at ERROR.
	OnAsyncError func(nc *nats.Conn, sub *nats.Subscription, err error)
}

// logged is the last ERROR record of one cause.
type logged struct {
	msg string
	at  time.Time
}

// Watch is one connection's retry policy and its state.
type Watch struct {
	cfg   Config
	log   *slog.Logger
	delay func(attempts int) time.Duration

	nc       atomic.Pointer[nats.Conn]
	up       atomic.Bool
	everUp   atomic.Bool // connected once: nats.go reports refusals to the ErrorHandler from then on
	failures atomic.Int64

	mu      sync.Mutex
	logged  map[string]logged // by cause: the last message logged, and when
	lastErr error             // the last failure reported (nil once connected)
}

// New returns a Watch for one connection. Pass its Options to nats.Connect
// (after any option of the caller's that sets the same handlers) and the
// connection to Bind.
func New(cfg Config) *Watch {
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	if cfg.Jitter <= 0 {
		cfg.Jitter = DefaultJitter
	}
	if cfg.MaxJitter <= 0 {
		cfg.MaxJitter = DefaultMaxJitter
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watch{cfg: cfg, log: log.With(cfg.Attrs...), delay: Delay(cfg.Wait, cfg.Jitter, cfg.MaxJitter)}
}

// Delay is a capped, jittered backoff for nats.go's CustomReconnectDelay:
// before round n (1, 2, ...) of one outage it waits wait plus a uniformly
// random part of a window that starts at jitter and doubles with each failed
// round, up to maxJitter.
func Delay(wait, jitter, maxJitter time.Duration) func(attempts int) time.Duration {
	return func(attempts int) time.Duration {
		window := jitter
		for i := 1; i < attempts && window < maxJitter; i++ {
			window *= 2
		}
		window = min(window, maxJitter)
		if window <= 0 {
			return wait
		}
		return wait + rand.N(window)
	}
}

// Options are the connection's retry policy and handlers: retry for ever,
// also after authorization errors, from the first connect on; the caller
// adds its name, credentials and TLS.
func (w *Watch) Options() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.IgnoreAuthErrorAbort(),
		nats.CustomReconnectDelay(func(attempts int) time.Duration {
			d := w.delay(attempts)
			// An attempt that dialled but whose CONNECT failed (refused
			// credentials, a TLS handshake refused) leaves its error as the
			// connection's last one until the next attempt; a failed dial
			// clears it (and was reported to the ReconnectErrHandler). This
			// delay comes once per round, after the round's last attempt,
			// so it sees that attempt's error only. Refusals are therefore
			// counted where nats.go reports each one: on a reconnect, in
			// the ErrorHandler (below), here only while the first connect
			// is retried, when nats.go reports them to no handler. A
			// round's earlier attempts that failed otherwise than by a
			// refusal or a dial (a TLS name a learned address does not
			// match) go uncounted; the round's last is.
			if nc := w.nc.Load(); nc != nil {
				if err := nc.LastError(); err != nil && !(w.everUp.Load() && IsAuthorization(err)) {
					w.failed(err, d)
				}
			}
			return d
		}),
		nats.ConnectHandler(func(nc *nats.Conn) { w.connected(nc, false) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { w.connected(nc, true) }),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if !w.up.Swap(false) {
				return
			}
			if err != nil {
				w.log.Warn(w.cfg.Prefix+": NATS disconnected; reconnecting", "error", err)
			}
			if w.cfg.OnDisconnect != nil {
				w.cfg.OnDisconnect(nc, err)
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			// Dial errors, and the first connect's own failure.
			if err != nil {
				w.failed(err, 0)
			}
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if sub == nil && IsAuthorization(err) && w.everUp.Load() {
				// A refused attempt of a reconnect: nats.go reports each
				// one here, whatever attempt of the round it was.
				w.failed(err, 0)
				return
			}
			if sub == nil && !w.up.Load() {
				// Another failed attempt's error (nats.go passes some on a
				// reconnect): the delay before the next attempt counts the
				// round's last.
				return
			}
			if w.cfg.OnAsyncError != nil {
				w.cfg.OnAsyncError(nc, sub, err)
				return
			}
			w.log.Error(w.cfg.Prefix+": NATS error", "error", err)
		}),
	}
}

// Bind gives the Watch the connection its Options made, which it reads the
// last error of.
func (w *Watch) Bind(nc *nats.Conn) {
	w.nc.Store(nc)
	if nc.IsConnected() {
		w.up.Store(true)
		w.everUp.Store(true)
	}
}

// Up reports whether the connection is connected.
func (w *Watch) Up() bool {
	if nc := w.nc.Load(); nc != nil {
		return nc.IsConnected()
	}
	return false
}

// Failures is the number of failed attempts so far.
func (w *Watch) Failures() int64 { return w.failures.Load() }

// LastFailure is the cause of the last failed attempt of the current outage,
// nil while connected.
func (w *Watch) LastFailure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

func (w *Watch) connected(nc *nats.Conn, reconnected bool) {
	w.up.Store(true)
	w.everUp.Store(true)
	w.mu.Lock()
	outage := w.lastErr != nil
	w.lastErr, w.logged = nil, nil
	w.mu.Unlock()
	// Not ConnectedUrlRedacted: it shows a lone user, which nats.go sends
	// as a token.
	attrs := []any{"url", natsurl.Redact(nc.ConnectedUrl()), "server_id", nc.ConnectedServerId()}
	if outage {
		attrs = append(attrs, "after_failures", w.failures.Load())
	}
	if reconnected {
		w.log.Info(w.cfg.Prefix+": NATS reconnected", attrs...)
	} else {
		w.log.Info(w.cfg.Prefix+": NATS connected", attrs...)
	}
	if w.cfg.OnConnect != nil {
		w.cfg.OnConnect(nc, reconnected)
	}
}

// failed counts one failed attempt and logs it at ERROR: at once when its
// message differs from the last one logged for its cause, else at most once
// per LogEvery per cause (a round can fail one way on one server and
// another way on the next, again and again).
func (w *Watch) failed(err error, retryIn time.Duration) {
	cause := Cause(err)
	n := w.failures.Add(1)
	if w.cfg.OnFailure != nil {
		w.cfg.OnFailure(cause)
	}
	now := w.cfg.Now()
	msg := err.Error()
	w.mu.Lock()
	w.lastErr = err
	last := w.logged[cause]
	log := msg != last.msg || now.Sub(last.at) >= LogEvery
	if log {
		if w.logged == nil {
			w.logged = map[string]logged{}
		}
		w.logged[cause] = logged{msg, now}
	}
	w.mu.Unlock()
	if !log {
		return
	}
	what := w.cfg.Prefix + ": cannot connect to NATS: no server answered; retrying for ever"
	if cause == CauseAuthorization {
		what = w.cfg.Prefix + ": NATS refused the connection's credentials (a password, nkey or credentials file the servers do not accept, or not yet); retrying for ever"
	}
	attrs := []any{"error", err, "cause", cause, "failures", n}
	if retryIn > 0 {
		attrs = append(attrs, "retry_in", retryIn.Round(time.Millisecond))
	}
	w.log.Error(what, attrs...)
}

// IsAuthorization reports whether err is a server's refusal of the
// connection's credentials.
func IsAuthorization(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		// nats.go passes some -ERR lines on as plain text.
		strings.Contains(strings.ToLower(errString(err)), "authorization violation")
}

// Cause is the metric label of a failed attempt's error.
func Cause(err error) string {
	if IsAuthorization(err) {
		return CauseAuthorization
	}
	return CauseNetwork
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
