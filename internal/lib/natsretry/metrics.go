package natsretry

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a daemon's NATS connection metrics, one series per connection
// it watches: <prefix>_connected (1 up, 0 down), when asked for, and
// <prefix>_connect_failures_total by cause. The label connection names the
// connection ("responder-3", "kick", "server"), so an alert says which one
// is down and why.
type Metrics struct {
	failures  *prometheus.CounterVec
	connected *prometheus.Desc // nil: no gauge

	mu      sync.Mutex
	watches []named
}

type named struct {
	name string
	w    *Watch
}

// NewMetrics registers the metrics on reg. prefix begins their names
// ("compass_callout_nats"); who is the daemon, for their help text. Without
// connected there is no gauge (a daemon with one of its own).
func NewMetrics(reg prometheus.Registerer, prefix, who string, connected bool) (*Metrics, error) {
	m := &Metrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_connect_failures_total",
			Help: "Failed attempts of " + who + "'s NATS connections to connect, by connection and cause: authorization_refused (a server refused the connection's credentials: a password, nkey or credentials file it does not accept), network (no server answered, or a dial, TLS or protocol handshake failed). Each is retried for ever with capped backoff.",
		}, []string{"connection", "cause"}),
	}
	cs := []prometheus.Collector{m.failures}
	if connected {
		m.connected = prometheus.NewDesc(prefix+"_connected",
			"1 while the NATS connection is up, 0 while it is down (reconnecting, or not connected yet), by connection.",
			[]string{"connection"}, nil)
		cs = append(cs, gauges{m})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Watch returns a Watch of cfg whose failures and state are the series of
// connection name.
func (m *Metrics) Watch(name string, cfg Config) *Watch {
	for _, c := range []string{CauseAuthorization, CauseNetwork} {
		m.failures.WithLabelValues(name, c) // at zero from the start, for rate()
	}
	next := cfg.OnFailure
	cfg.OnFailure = func(cause string) {
		m.failures.WithLabelValues(name, cause).Inc()
		if next != nil {
			next(cause)
		}
	}
	w := New(cfg)
	m.mu.Lock()
	m.watches = append(m.watches, named{name, w})
	m.mu.Unlock()
	return w
}

// gauges collects <prefix>_connected.
type gauges struct{ m *Metrics }

func (g gauges) Describe(ch chan<- *prometheus.Desc) { ch <- g.m.connected }

func (g gauges) Collect(ch chan<- prometheus.Metric) {
	g.m.mu.Lock()
	ws := append([]named(nil), g.m.watches...)
	g.m.mu.Unlock()
	for _, n := range ws {
		v := 0.0
		if n.w.Up() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(g.m.connected, prometheus.GaugeValue, v, n.name)
	}
}
