package kick

import "github.com/prometheus/client_golang/prometheus"

// metrics are the Kicker's Prometheus metrics (docs/callout.md, "Revocation").
type metrics struct {
	kicks      *prometheus.CounterVec
	sweeps     *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	dupChecks  *prometheus.CounterVec
	listings   prometheus.Counter
	failing    prometheus.Gauge
	live       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		kicks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_kicks_total",
			Help: "Live Runner connections the callout ended or tried to end, by reason (node_denied, cluster_removed, token_revoked, token_expired, key_removed, duplicate, quarantined, refused) and result (kicked; gone: already closed; failed: retried).",
		}, []string{"reason", "result"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_kick_sweeps_total",
			Help: "Sweeps of the live Runner connections against the clusters, deny lists and revocations in force, by result (ok; failed: the listing or the policy failed, retried).",
		}, []string{"result"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_duplicate_connections_total",
			Help: "Older live connections found for a Runner ID that had just authenticated again past the duplicate grace (a reconnect race or a copied token), by action (kicked, kept).",
		}, []string{"action"}),
		dupChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_duplicate_checks_total",
			Help: "Duplicate checks done, by how (events: the account's connect and disconnect events showed no older connection, no request made; listing: the servers were asked).",
		}, []string{"by"}),
		listings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_callout_kick_listings_total",
			Help: "Sweeps that listed every connection of the Runners' account from every NATS server; the other sweeps judged the account's connect and disconnect events' index and asked the servers nothing.",
		}),
		failing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "compass_callout_kicks_failing",
			Help: "1 while the last sweep could not list the connections or end one it had to; the sweep is retried with backoff until it succeeds.",
		}),
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "compass_callout_runner_connections",
			Help: "Live Runner connections in the Runners' account at the last sweep, on every NATS server that answered.",
		}),
	}
	for _, r := range []Reason{ReasonNodeDenied, ReasonClusterRemoved, ReasonTokenRevoked, ReasonTokenExpired, ReasonKeyRemoved, ReasonDuplicate, ReasonQuarantined, ReasonPodDeleted, ReasonRefused} {
		for _, res := range []string{"kicked", "gone", "failed"} {
			m.kicks.WithLabelValues(string(r), res)
		}
	}
	for _, res := range []string{"ok", "failed"} {
		m.sweeps.WithLabelValues(res)
	}
	for _, a := range []string{"kicked", "kept"} {
		m.duplicates.WithLabelValues(a)
	}
	for _, b := range []string{"events", "listing"} {
		m.dupChecks.WithLabelValues(b)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.kicks, m.sweeps, m.duplicates, m.dupChecks, m.listings, m.failing, m.live} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
