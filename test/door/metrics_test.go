package door_test

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// scrape reads the compass_cluster_* and compass_build_info families from a
// /metrics endpoint.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	all, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for name, f := range all {
		if strings.HasPrefix(name, "compass_cluster_") || name == "compass_build_info" || name == "compass_verifier_cache_lookups_total" {
			out[name] = f
		}
	}
	return out
}

// shape is a family's type, help and, per cluster, its label names and value
// class (whether the gauge is zero), which both daemons must agree on.
func shape(f *dto.MetricFamily) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %q\n", f.GetName(), f.GetType(), f.GetHelp())
	var lines []string
	for _, m := range f.GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			v := l.GetValue()
			if l.GetName() == "program" {
				v = "*"
			}
			labels = append(labels, l.GetName()+"="+v)
		}
		lines = append(lines, fmt.Sprintf("  %s zero=%v", strings.Join(labels, ","), m.GetGauge().GetValue() == 0))
	}
	slices.Sort(lines)
	b.WriteString(strings.Join(lines, "\n"))
	return b.String()
}

// compass-server and compass-callout, run over the same cluster file (one
// cluster usable, one whose keys never load), export the same key-set
// families with the same labels and polarity, and a key-set age for the
// cluster that never loaded.
func TestBothDaemonsExportTheSameKeySetMetrics(t *testing.T) {
	dir := t.TempDir()
	prod := verifiertest.Issuer(t, kubeissuer.Options{})
	dark := verifiertest.Issuer(t, kubeissuer.Options{Wrap: testutil.NewFailingJWKS(true).Wrap})
	clusters := verifiertest.ClusterFile(t, dir, verifiertest.ClusterEntry(t, prod, dir, "prod"), verifiertest.ClusterEntry(t, dark, dir, "dark"))

	// Both clusters' first load attempts, at the callout.
	var mu sync.Mutex
	attempted := map[string]bool{}
	loaded := make(chan struct{})
	d := startDaemons(t, clusters, daemonOpts{loadHook: func(ev verifier.LoadEvent) {
		mu.Lock()
		defer mu.Unlock()
		if len(attempted) < 2 {
			attempted[ev.Cluster] = true
			if len(attempted) == 2 {
				close(loaded)
			}
		}
	}})
	serverAddr, calloutAddr := d.serverAddr, d.calloutAddr
	// The callout loads keys in the background: wait for both clusters'
	// first attempts there (the Server's Ready refreshed them already).
	select {
	case <-loaded:
	case <-time.After(waitFor):
		t.Fatal("the callout never tried both clusters' keys")
	}
	fromServer, fromCallout := scrape(t, serverAddr), scrape(t, calloutAddr)
	want := []string{
		"compass_build_info", "compass_cluster_file_applied_timestamp_seconds", "compass_cluster_file_reload_failing",
		"compass_cluster_file_reloads_total", "compass_cluster_key_fetch_error_timestamp_seconds", "compass_cluster_key_fetch_failing",
		"compass_cluster_keys", "compass_cluster_keys_loaded_timestamp_seconds", "compass_cluster_keys_usable",
		"compass_cluster_keyset_age_seconds", "compass_verifier_cache_lookups_total",
	}
	for _, got := range []map[string]*dto.MetricFamily{fromServer, fromCallout} {
		if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, want) {
			t.Fatalf("families %v, want %v", names, want)
		}
	}
	for _, name := range want {
		if name == "compass_cluster_keyset_age_seconds" || name == "compass_cluster_key_fetch_error_timestamp_seconds" || name == "compass_cluster_keys_loaded_timestamp_seconds" ||
			name == "compass_cluster_file_applied_timestamp_seconds" || name == "compass_verifier_cache_lookups_total" {
			continue // values are times or each daemon's own counts; their shape is checked below
		}
		if a, b := shape(fromServer[name]), shape(fromCallout[name]); a != b {
			t.Fatalf("%s differs:\nserver:\n%s\ncallout:\n%s", name, a, b)
		}
	}
	for _, got := range []map[string]*dto.MetricFamily{fromServer, fromCallout} {
		var results []string
		for _, m := range got["compass_verifier_cache_lookups_total"].GetMetric() {
			results = append(results, m.GetLabel()[0].GetValue())
		}
		if slices.Sort(results); !slices.Equal(results, []string{"hit", "miss"}) {
			t.Fatalf("cache lookups by result %v, want hit and miss", results)
		}
	}
	usable := shape(fromServer["compass_cluster_keys_usable"])
	if !strings.Contains(usable, "cluster=prod,reason= zero=false") || !strings.Contains(usable, "cluster=dark,reason=") {
		t.Fatalf("usable:\n%s", usable)
	}
	for _, got := range []map[string]*dto.MetricFamily{fromServer, fromCallout} {
		ages := map[string]float64{}
		for _, m := range got["compass_cluster_keyset_age_seconds"].GetMetric() {
			ages[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
		if _, ok := ages["dark"]; !ok || len(ages) != 2 {
			t.Fatalf("keyset ages %v: want one for each cluster, the never-loaded one included", ages)
		}
	}
}
