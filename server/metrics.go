package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/verifier"
)

// clusterCollector exports each registered cluster's key-set state at
// scrape time, so an operator sees a cluster failing closed (keys never
// fetched, stale, or shared with another cluster) before Runners report
// Unavailable.
type clusterCollector struct {
	status func() []verifier.ClusterStatus
	usable *prometheus.Desc
	keys   *prometheus.Desc
	loaded *prometheus.Desc
}

func newClusterCollector(status func() []verifier.ClusterStatus) *clusterCollector {
	return &clusterCollector{
		status: status,
		usable: prometheus.NewDesc("compass_runner_cluster_keys_usable",
			"1 when the cluster's key set verifies tokens, 0 when its tokens get Unavailable (never loaded, stale, or a key shared with another cluster).",
			[]string{"cluster"}, nil),
		keys: prometheus.NewDesc("compass_runner_cluster_keys",
			"Usable keys in the cluster's key set.", []string{"cluster"}, nil),
		loaded: prometheus.NewDesc("compass_runner_cluster_keys_loaded_timestamp_seconds",
			"Unix time of the cluster's last successful key-set load (0: never).", []string{"cluster"}, nil),
	}
}

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.usable
	ch <- c.keys
	ch <- c.loaded
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.status() {
		usable := 0.0
		if s.Usable {
			usable = 1
		}
		loaded := 0.0
		if !s.LoadedAt.IsZero() {
			loaded = float64(s.LoadedAt.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(c.usable, prometheus.GaugeValue, usable, s.Name)
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(s.Keys), s.Name)
		ch <- prometheus.MustNewConstMetric(c.loaded, prometheus.GaugeValue, loaded, s.Name)
	}
}
