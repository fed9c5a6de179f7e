package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter reads the counter name from g: the value of its first series
// whose every label has the value labels gives it (a label that labels does
// not name must be empty), or 0 when no series matches.
func Counter(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
