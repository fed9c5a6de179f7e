package runner

import (
	"errors"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Causes of compass_runner_nats_reconnects_total and
// compass_runner_nats_connect_failures_total.
const (
	// CauseNetwork: a live connection was lost and nats.go connected again
	// (reconnects), or a dial or handshake failed (connect failures).
	CauseNetwork = "network"
	// CauseRotation: an early reconnect with the current token, before the
	// old token or user JWT ran out (a handover).
	CauseRotation = "rotation"
	// CauseAuthorizationRefused: nats-server or its auth callout refused the
	// CONNECT (not registered, revoked, wrong audience, keys unavailable).
	CauseAuthorizationRefused = "authorization_refused"
	// CauseSlowAuth: the server's first PING came before the callout's
	// answer (IsSlowAuth): the callout or the server is too slow.
	CauseSlowAuth = "slow_auth"
)

// Outcomes of compass_runner_commands_total.
const (
	CommandOK      = "ok"      // answered with a result
	CommandError   = "error"   // the command ran and failed
	CommandInvalid = "invalid" // too large, or not a request envelope
	CommandUnknown = "unknown" // no such command
)

// otherCommand is the command label of a request that names no known
// command: the label is bounded by the command table, whatever arrives.
const otherCommand = "other"

// Metrics are the Runner's Prometheus metrics, served on the health listener
// at /metrics. They carry no token, no Runner ID and no server address: the
// listener binds the pod's address, which anything in the cluster network
// may reach, and what it tells is the state a node's Runner is in.
type Metrics struct {
	reg             *prometheus.Registry
	reconnects      *prometheus.CounterVec
	connectFailures *prometheus.CounterVec
	disconnects     prometheus.Counter
	authExpired     prometheus.Counter
	commands        *prometheus.CounterVec
	replies         *prometheus.CounterVec
	enroll          *prometheus.CounterVec
}

// NewMetrics returns the Runner's metrics on a registry of their own (with
// the Go and process collectors). Pass them as Config.Metrics, and
// ObserveEnroll as the enroll client's Retry.OnAttempt; a Runner without
// them makes its own.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_runner_nats_reconnects_total",
			Help: "NATS connections made again after the first, by cause: network (a lost connection re-established by nats.go), rotation (an early reconnect with the current token before the old one or its user JWT ran out).",
		}, []string{"cause"}),
		connectFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_runner_nats_connect_failures_total",
			Help: "NATS connection attempts that failed, by cause: authorization_refused (the server or its auth callout refused the token), slow_auth (the server's first PING came before the callout's answer), network (a dial or handshake failed). Each is retried on the reconnect backoff.",
		}, []string{"cause"}),
		disconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_runner_nats_disconnects_total",
			Help: "Live NATS connections lost (nats.go then reconnects).",
		}),
		authExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_runner_nats_authorization_expired_total",
			Help: "Times nats-server ended the Runner's user authorization at its expiry before an early reconnect replaced it; the Runner reconnects with the current token.",
		}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_runner_commands_total",
			Help: "Commands received on the Runner's command subject, by command (other: a name the Runner does not know) and outcome: ok, error (the command failed), invalid (too large or not a request), unknown (no such command).",
		}, []string{"command", "outcome"}),
		replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_runner_command_replies_total",
			Help: "Answers to commands, by result: sent, or failed (the reply could not be published).",
		}, []string{"result"}),
		enroll: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_runner_enroll_attempts_total",
			Help: "Enroll calls to the Server's door, by result: ok, or the gRPC status code of a failed attempt (unavailable and deadline_exceeded are retried).",
		}, []string{"result"}),
	}
	// The label values known in advance are created at zero, so that a rate
	// is defined before the first event and the families are in /metrics
	// from the start.
	for _, c := range []string{CauseNetwork, CauseRotation} {
		m.reconnects.WithLabelValues(c)
	}
	for _, c := range []string{CauseAuthorizationRefused, CauseSlowAuth, CauseNetwork} {
		m.connectFailures.WithLabelValues(c)
	}
	for _, r := range []string{"sent", "failed"} {
		m.replies.WithLabelValues(r)
	}
	m.enroll.WithLabelValues("ok")
	m.reg.MustRegister(m.reconnects, m.connectFailures, m.disconnects, m.authExpired, m.commands, m.replies, m.enroll)
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Register registers more collectors on the Runner's registry (the build
// info, the Go and process collectors).
func (m *Metrics) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ObserveEnroll counts one Enroll attempt; pass it as Retry.OnAttempt.
func (m *Metrics) ObserveEnroll(err error) {
	m.enroll.WithLabelValues(enrollResult(err)).Inc()
}

func enrollResult(err error) string {
	if err == nil {
		return "ok"
	}
	// connect.CodeOf is Unknown for an error that carries no code: a
	// transport failure the client could not map.
	return connect.CodeOf(err).String()
}

// observeLink counts one link event.
func (m *Metrics) observeLink(ev LinkEvent) {
	switch ev.Kind {
	case EventReconnected:
		m.reconnects.WithLabelValues(CauseNetwork).Inc()
	case EventHandover:
		m.reconnects.WithLabelValues(CauseRotation).Inc()
	case EventDisconnected:
		m.disconnects.Inc()
	case EventSlowAuth:
		m.connectFailures.WithLabelValues(CauseSlowAuth).Inc()
	case EventConnectFailed:
		m.connectFailures.WithLabelValues(CauseNetwork).Inc()
	case EventAuthError:
		if errors.Is(ev.Err, nats.ErrAuthExpired) {
			m.authExpired.Inc()
			return
		}
		m.connectFailures.WithLabelValues(CauseAuthorizationRefused).Inc()
	}
}

// knownCommands creates each command's ok series at zero, so the family is
// in /metrics before the first command.
func (m *Metrics) knownCommands(table map[string]CommandFunc) {
	for name := range table {
		m.commands.WithLabelValues(name, CommandOK)
	}
}

// observeCommand counts one command; name is the request's command, counted
// as itself only when known.
func (m *Metrics) observeCommand(name string, known bool, outcome string) {
	if !known {
		name = otherCommand
	}
	m.commands.WithLabelValues(name, outcome).Inc()
}

func (m *Metrics) observeReply(err error) {
	if err != nil {
		m.replies.WithLabelValues("failed").Inc()
		return
	}
	m.replies.WithLabelValues("sent").Inc()
}

var (
	descConnected = prometheus.NewDesc("compass_runner_nats_connected",
		"1 while the Runner's current NATS connection is up (enrolled, connected, its command subscription on the server), else 0.", nil, nil)
	descEnrolled = prometheus.NewDesc("compass_runner_enrolled",
		"1 once the Runner has enrolled with the Server (or has a Runner ID without one), else 0.", nil, nil)
	descTokenSource = prometheus.NewDesc("compass_runner_token_source_info",
		"Always 1; source says where the Runner's token comes from: file (a projected ServiceAccount token, re-read on every use) or static (a minted token from the environment).",
		[]string{"source"}, nil)
	descTokenRemaining = prometheus.NewDesc("compass_runner_token_remaining_seconds",
		"Seconds until the current token expires (negative: expired and not replaced). Absent for a minted opaque token, which has no expiry the Runner can read.", nil, nil)
)

// runnerCollector reads the Runner's state at scrape time.
type runnerCollector struct{ r *Runner }

func (c runnerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnected, descEnrolled, descTokenSource, descTokenRemaining} {
		ch <- d
	}
}

func (c runnerCollector) Collect(ch chan<- prometheus.Metric) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, b(c.r.Ready()))
	ch <- prometheus.MustNewConstMetric(descEnrolled, prometheus.GaugeValue, b(c.r.enrolled.Load()))
	ch <- prometheus.MustNewConstMetric(descTokenSource, prometheus.GaugeValue, 1, c.r.tokenSource())
	if e, ok := c.r.cfg.Tokens.(Expirer); ok {
		if exp, ok := e.Expiry(); ok {
			ch <- prometheus.MustNewConstMetric(descTokenRemaining, prometheus.GaugeValue, exp.Sub(c.r.cfg.Now()).Round(time.Millisecond).Seconds())
		}
	}
}

// tokenSource names the Runner's token source, for info and the metrics.
func (r *Runner) tokenSource() string {
	if _, ok := r.cfg.Tokens.(*FileToken); ok {
		return "file"
	}
	return "static"
}
