package callout

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/verifier"
)

// Metrics are compass-callout's Prometheus metrics: decisions by outcome,
// drops by reason, decision latency, requests in flight, and each runner
// cluster's key-set state from the verifier.
type Metrics struct {
	decisions *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	latency   prometheus.Histogram
	slack     prometheus.Histogram
}

// NewMetrics registers the metrics on reg. inFlight reports the requests
// queued or being handled (Responder.InFlight); status reports the clusters
// (RunnerVerifier.Status; nil when no cluster is registered); now is the clock
// for key-set ages.
func NewMetrics(reg prometheus.Registerer, inFlight func() int64, status func() []verifier.ClusterStatus, now func() time.Time) (*Metrics, error) {
	if now == nil {
		now = time.Now
	}
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
	}
	for _, o := range []Outcome{OutcomeAuthorized, OutcomeDenied, OutcomeKeysUnavailable, OutcomeDropped, OutcomeError} {
		m.decisions.WithLabelValues(string(o))
	}
	cs := []prometheus.Collector{
		m.decisions, m.dropped, m.latency, m.slack,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "compass_callout_in_flight",
			Help: "Authorization requests queued or being handled.",
		}, func() float64 { return float64(inFlight()) }),
	}
	if status != nil {
		cs = append(cs, &clusterCollector{status: status, now: now})
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
}

// clusterCollector reads the verifier's cluster status at scrape time.
type clusterCollector struct {
	status func() []verifier.ClusterStatus
	now    func() time.Time
}

var (
	descKeysetAge = prometheus.NewDesc("compass_callout_cluster_keyset_age_seconds",
		"Seconds since the cluster's key set was last loaded successfully (absent when never loaded).", []string{"cluster"}, nil)
	descKeys = prometheus.NewDesc("compass_callout_cluster_keys",
		"Usable signing keys loaded for the cluster.", []string{"cluster"}, nil)
	descFetchError = prometheus.NewDesc("compass_callout_cluster_last_fetch_error",
		"1 when the cluster's last key fetch failed, else 0.", []string{"cluster"}, nil)
	descFetchErrorTime = prometheus.NewDesc("compass_callout_cluster_last_fetch_error_timestamp_seconds",
		"Unix time of the cluster's last failed key fetch (absent when none).", []string{"cluster"}, nil)
	descFailClosed = prometheus.NewDesc("compass_callout_cluster_fail_closed",
		"1 when tokens of the cluster are refused with keys unavailable (never loaded, stale, or a key shared with another cluster).", []string{"cluster", "reason"}, nil)
)

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKeysetAge, descKeys, descFetchError, descFetchErrorTime, descFailClosed} {
		ch <- d
	}
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, s := range c.status() {
		if !s.LoadedAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(descKeysetAge, prometheus.GaugeValue, now.Sub(s.LoadedAt).Seconds(), s.Name)
		}
		ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(s.Keys), s.Name)
		fetchErr := 0.0
		if s.LastError != "" {
			fetchErr = 1
		}
		ch <- prometheus.MustNewConstMetric(descFetchError, prometheus.GaugeValue, fetchErr, s.Name)
		if !s.LastErrorAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(descFetchErrorTime, prometheus.GaugeValue, float64(s.LastErrorAt.Unix()), s.Name)
		}
		closed := 0.0
		if !s.Usable {
			closed = 1
		}
		ch <- prometheus.MustNewConstMetric(descFailClosed, prometheus.GaugeValue, closed, s.Name, s.Reason)
	}
}
