// Package keymetrics is the one Prometheus collector of the runner clusters'
// key sets, shared by compass-server and compass-callout so both export the
// same families with the same meaning, and the compass_build_info gauge.
package keymetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/buildinfo"
	"github.com/compass-runner/identity/verifier"
)

var (
	descUsable = prometheus.NewDesc("compass_cluster_keys_usable",
		"1 when the cluster's key set verifies tokens; 0 when its tokens get keys unavailable (never loaded, stale, or a key shared with another cluster; see reason).",
		[]string{"cluster", "reason"}, nil)
	descKeys = prometheus.NewDesc("compass_cluster_keys",
		"Usable signing keys in the cluster's key set.", []string{"cluster"}, nil)
	descAge = prometheus.NewDesc("compass_cluster_keyset_age_seconds",
		"Seconds since the cluster's key set was last loaded successfully; since the process started when it never was, so a cluster that never loaded ages like a stale one.",
		[]string{"cluster"}, nil)
	descLoaded = prometheus.NewDesc("compass_cluster_keys_loaded_timestamp_seconds",
		"Unix time of the cluster's last successful key-set load (0: never).", []string{"cluster"}, nil)
	descFetchFailing = prometheus.NewDesc("compass_cluster_key_fetch_failing",
		"1 when the cluster's last key fetch failed, else 0.", []string{"cluster"}, nil)
	descFetchErrorTime = prometheus.NewDesc("compass_cluster_key_fetch_error_timestamp_seconds",
		"Unix time of the cluster's last failed key fetch (0: none).", []string{"cluster"}, nil)
	descCache = prometheus.NewDesc("compass_verifier_cache_lookups_total",
		"Projected tokens looked up in the verified-token cache: result=hit answered without parsing or a signature check, miss verified in full.",
		[]string{"result"}, nil)
	descReviews = prometheus.NewDesc("compass_token_reviews_total",
		"Projected tokens of a cluster with tokenReview that its API server was asked about (cached answers included), by outcome: accepted; rejected (the pod is gone or the token bound to another, so refused); fell_back (the API server could not answer, accepted on offline verification: onUnavailable offline); refused (could not answer, refused: onUnavailable refuse). Since the cluster's tokenReview was configured.",
		[]string{"cluster", "outcome"}, nil)
	descWatchUp = prometheus.NewDesc("compass_pod_watch_up",
		"1 while the cluster's pod watch (tokenReview.watchPods) is established; 0 while it is not (it retries for ever, logging why at ERROR): a deleted pod's live connections are then not ended until their user JWTs expire.",
		[]string{"cluster"}, nil)
	descPodsGone = prometheus.NewDesc("compass_pods_gone_total",
		"Runner pods the cluster's pod watch saw go (deleted, or marked for deletion): their tokens are refused at once and their live NATS connections ended (kick reason pod_deleted).",
		[]string{"cluster"}, nil)
)

// Collector reads the verifier's cluster status at scrape time.
type Collector struct {
	status  func() []verifier.ClusterStatus
	started time.Time
	now     func() time.Time
	cache   func() (hits, misses uint64)
}

// WithCacheStats also exports the verified-token cache's lookups; stats is
// RunnerVerifier.CacheStats.
func (c *Collector) WithCacheStats(stats func() (hits, misses uint64)) *Collector {
	c.cache = stats
	return c
}

// New returns the key-set collector. status is RunnerVerifier.Status (nil:
// no cluster registered, nothing exported); started is when the process
// started; now is the clock (nil: time.Now).
func New(status func() []verifier.ClusterStatus, started time.Time, now func() time.Time) *Collector {
	if now == nil {
		now = time.Now
	}
	return &Collector{status: status, started: started, now: now}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUsable, descKeys, descAge, descLoaded, descFetchFailing, descFetchErrorTime, descCache, descReviews, descWatchUp, descPodsGone} {
		ch <- d
	}
}

func unix(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.status == nil {
		return
	}
	if c.cache != nil {
		hits, misses := c.cache()
		ch <- prometheus.MustNewConstMetric(descCache, prometheus.CounterValue, float64(hits), "hit")
		ch <- prometheus.MustNewConstMetric(descCache, prometheus.CounterValue, float64(misses), "miss")
	}
	now := c.now()
	for _, s := range c.status() {
		since := s.LoadedAt
		if since.IsZero() {
			since = c.started
		}
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{s.Name}, labels...)...)
		}
		gauge(descUsable, b2f(s.Usable), s.Reason)
		gauge(descKeys, float64(s.Keys))
		gauge(descAge, max(0, now.Sub(since).Seconds()))
		gauge(descLoaded, unix(s.LoadedAt))
		gauge(descFetchFailing, b2f(s.LastError != ""))
		gauge(descFetchErrorTime, unix(s.LastErrorAt))
		if r := s.Reviews; r != nil {
			for _, o := range []struct {
				outcome string
				n       uint64
			}{{"accepted", r.Accepted}, {"rejected", r.Rejected}, {"fell_back", r.FellBack}, {"refused", r.Refused}} {
				ch <- prometheus.MustNewConstMetric(descReviews, prometheus.CounterValue, float64(o.n), s.Name, o.outcome)
			}
			if r.Watching {
				gauge(descWatchUp, b2f(r.WatchUp))
				ch <- prometheus.MustNewConstMetric(descPodsGone, prometheus.CounterValue, float64(r.PodsGone), s.Name)
			}
		}
	}
}

// BuildInfo is compass_build_info{program,version,revision,goversion} 1.
func BuildInfo(program string) prometheus.Collector {
	b := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "compass_build_info",
		Help:        "Always 1; the labels say which build of which program is running.",
		ConstLabels: prometheus.Labels{"program": program, "version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}

// Register registers the key-set collector and the build info on reg.
func Register(reg prometheus.Registerer, program string, c *Collector) error {
	for _, col := range []prometheus.Collector{c, BuildInfo(program)} {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	return nil
}
