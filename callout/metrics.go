package callout

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are compass-callout's Prometheus metrics: decisions by outcome,
// drops by reason, decision latency, answers past the horizon and requests in
// flight. The clusters' key-set state is verifier/keymetrics, shared with
// compass-server.
type Metrics struct {
	decisions   *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	latency     prometheus.Histogram
	slack       prometheus.Histogram
	pastHorizon prometheus.Counter
	keyAnswers  *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg. inFlight reports the requests
// queued or being handled (Responder.InFlight), lag the longest lag of the
// callout's NATS connections (Responder.NATSLag).
func NewMetrics(reg prometheus.Registerer, inFlight func() int64, lag func() time.Duration) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_decisions_total",
			Help: "Authorization requests by outcome: authorized, denied (not authorized), keys_unavailable, dropped (not answered), error (could not answer).",
		}, []string{"outcome"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_dropped_total",
			Help: "Authorization requests not answered, by reason (expired, invalid, seal_mismatch, undecryptable, replayed, ...).",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "compass_callout_decision_seconds",
			Help: "Time from a request leaving the queue to its answer being published.",
			// 100 µs to ~3 s: a decision is a few hundred µs; a key fetch or a
			// database lookup can take up to the server's auth timeout.
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 15),
		}),
		slack: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "compass_callout_answer_slack_seconds",
			Help: "Time left before a request's expiry (whole seconds, as the server sets it) when its answer was published. Near the server's auth timeout when healthy; toward zero when requests queue, before the server starts giving up on them.",
			// 50 ms to 6.4 s: the auth timeout is 2 s by default, 5 s in deploy/nats.
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 8),
		}),
		keyAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_key_answers_total",
			Help: "Answers by the public key that made them: role xkey (the key the request was sealed to) or issuer (the key that signed the answer). While a key rotation rolls through the NATS servers both keys of a role count; once the old one stops, no server asks with the old configuration.",
		}, []string{"role", "key"}),
		pastHorizon: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_callout_answers_past_horizon_total",
			Help: "Answers published more than the answer horizon (--answer-horizon) after their request arrived. nats-server sends a client its first PING about 2 s after its CONNECT, before it asks the callout, and nats.go fails a CONNECT that sees that PING first, so such an answer most likely reached no one.",
		}),
	}
	for _, o := range []Outcome{OutcomeAuthorized, OutcomeDenied, OutcomeKeysUnavailable, OutcomeDropped, OutcomeError} {
		m.decisions.WithLabelValues(string(o))
	}
	// Every drop reason at zero from the start: the alerts take rates of
	// them (a reason that first appears is otherwise an increase no rate
	// sees), and test/e2e finds the family in a fresh callout's /metrics.
	for _, r := range []string{DropExpired, DropPastHorizon, DropInvalid, DropSealMismatch, DropUndecryptable, DropReplayed,
		DropTooLarge, DropWrongSubject, DropShuttingDown, DropNoReply, DropServerXKeyMis, DropOverload} {
		m.dropped.WithLabelValues(r)
	}
	cs := []prometheus.Collector{
		m.decisions, m.dropped, m.latency, m.slack, m.pastHorizon, m.keyAnswers,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "compass_callout_in_flight",
			Help: "Authorization requests queued or being handled.",
		}, func() float64 { return float64(inFlight()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "compass_callout_nats_lag_seconds",
			Help: "How late nats-server handles what the callout sends, on its worst connection: the time the PING each connection keeps in flight has been out, or its last round trip. A request's age counts it, so past the answer horizon requests are dropped unverified (past_horizon): the server is short of CPU.",
		}, func() float64 { return lag().Seconds() }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observe records one decision; pass it as Config.Observe.
func (m *Metrics) Observe(ev Event) {
	m.decisions.WithLabelValues(string(ev.Outcome)).Inc()
	if ev.Outcome == OutcomeDropped {
		m.dropped.WithLabelValues(ev.Reason).Inc()
		return
	}
	m.latency.Observe(ev.Latency.Seconds())
	if !ev.RequestExpiry.IsZero() && answered(ev.Outcome) {
		m.slack.Observe(ev.Slack.Seconds())
	}
	if ev.PastHorizon && answered(ev.Outcome) {
		m.pastHorizon.Inc()
	}
	if answered(ev.Outcome) {
		if ev.XKey != "" {
			m.keyAnswers.WithLabelValues(KeyRoleXKey, ev.XKey).Inc()
		}
		if ev.Issuer != "" {
			m.keyAnswers.WithLabelValues(KeyRoleIssuer, ev.Issuer).Inc()
		}
	}
}

// HoldKeys shows every key the responder holds (Responder.HeldKeys) in
// compass_callout_key_answers_total from the start, at zero until it
// answers: a key that never answers is visible as such.
func (m *Metrics) HoldKeys(held map[string][]string) {
	for _, role := range []string{KeyRoleXKey, KeyRoleIssuer} {
		for _, k := range held[role] {
			m.keyAnswers.WithLabelValues(role, k)
		}
	}
}
