package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter finds the series whose labels are exactly those asked for, reads
// an unlabelled counter with no labels, and is 0 for what is not there.
func TestCounterReadsTheSeriesWithTheLabelsAskedFor(t *testing.T) {
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "auth_total", Help: "h"}, []string{"want", "code"})
	plain := prometheus.NewCounter(prometheus.CounterOpts{Name: "plain_total", Help: "h"})
	reg.MustRegister(vec, plain)
	vec.WithLabelValues("runner", "ok").Add(3)
	vec.WithLabelValues("runner", "unavailable").Add(5)
	vec.WithLabelValues("account", "ok").Add(7)
	plain.Add(11)
	for _, tc := range []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"both labels", "auth_total", map[string]string{"want": "runner", "code": "unavailable"}, 5},
		{"other values", "auth_total", map[string]string{"want": "account", "code": "ok"}, 7},
		{"a label left out must be empty", "auth_total", map[string]string{"want": "runner"}, 0},
		{"no such series", "auth_total", map[string]string{"want": "account", "code": "unavailable"}, 0},
		{"unlabelled", "plain_total", nil, 11},
		{"no such metric", "missing_total", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Counter(t, reg, tc.metric, tc.labels); got != tc.want {
				t.Errorf("Counter(%s, %v) = %v, want %v", tc.metric, tc.labels, got, tc.want)
			}
		})
	}
}
