package podwatch_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/podwatch"
)

type roundTripper struct{}

func (roundTripper) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, http.ErrNotSupported
}

// New checks its Config and reports every problem, each naming its field.
func TestNewValidates(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	notPEM := filepath.Join(dir, "not-pem")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	gone := func(podwatch.Gone) {}
	for _, tc := range []struct {
		name   string
		edit   func(c *podwatch.Config)
		onGone func(podwatch.Gone)
		opts   []podwatch.Option
		err    string
	}{
		{"valid", func(c *podwatch.Config) {}, gone, nil, ""},
		{"no selector", func(c *podwatch.Config) { c.LabelSelector = "" }, gone, nil, ""},
		{"a set-based selector", func(c *podwatch.Config) { c.LabelSelector = "app in (a, b),!legacy,tier!=x" }, gone, nil, ""},
		{"a path prefix", func(c *podwatch.Config) { c.Server += "/k8s/" }, gone, nil, ""},
		{"nothing", func(c *podwatch.Config) { *c = podwatch.Config{} }, nil, nil,
			"podwatch: onGone: required\npodwatch: Config.Server: required\npodwatch: Config.TokenFile: required\npodwatch: Config.Namespace: required"},
		{"http", func(c *podwatch.Config) { c.Server = "http://127.0.0.1:6443" }, gone, nil,
			`podwatch: Config.Server: scheme "http", want https`},
		{"credentials in the URL", func(c *podwatch.Config) { c.Server = "https://admin:secret@127.0.0.1:6443" }, gone, nil,
			"podwatch: Config.Server: holds credentials: the watcher's credential is Config.TokenFile"},
		{"a query", func(c *podwatch.Config) { c.Server = "https://127.0.0.1:6443/?x=1" }, gone, nil,
			"podwatch: Config.Server: https://127.0.0.1:6443/?x=1 has a query or a fragment"},
		{"no host", func(c *podwatch.Config) { c.Server = "https:///api" }, gone, nil, "podwatch: Config.Server: no host"},
		{"not a URL", func(c *podwatch.Config) { c.Server = "https://a b\x7f" }, gone, nil, "podwatch: Config.Server: not a URL"},
		{"token file missing", func(c *podwatch.Config) { c.TokenFile = filepath.Join(dir, "missing") }, gone, nil,
			"podwatch: Config.TokenFile: stat " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{"token file empty", func(c *podwatch.Config) { c.TokenFile = empty }, gone, nil,
			"podwatch: Config.TokenFile: " + empty + " is empty"},
		{"a namespace not a label", func(c *podwatch.Config) { c.Namespace = "Compass_Runner" }, gone, nil,
			`podwatch: Config.Namespace: "Compass_Runner" is not a namespace name (an RFC 1123 label)`},
		{"a selector with a quote", func(c *podwatch.Config) { c.LabelSelector = `app="x"` }, gone, nil,
			`podwatch: Config.LabelSelector: "app=\"x\"" holds a character no label selector has`},
		{"a selector too long", func(c *podwatch.Config) { c.LabelSelector = strings.Repeat("a", 1025) }, gone, nil,
			"podwatch: Config.LabelSelector: longer than 1024 bytes"},
		{"CA missing", func(c *podwatch.Config) { c.CAFile = filepath.Join(dir, "missing") }, gone, nil,
			"podwatch: Config.CAFile: open " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{"CA not PEM", func(c *podwatch.Config) { c.CAFile = notPEM }, gone, nil,
			"podwatch: Config.CAFile: " + notPEM + " holds no PEM certificate"},
		{"CA with a foreign transport", func(c *podwatch.Config) {}, gone,
			[]podwatch.Option{podwatch.WithHTTPClient(&http.Client{Transport: roundTripper{}})},
			"podwatch: Config.CAFile: the HTTP client's transport is not an *http.Transport"},
		{"a foreign transport without a CA", func(c *podwatch.Config) { c.CAFile = "" }, gone,
			[]podwatch.Option{podwatch.WithHTTPClient(&http.Client{Transport: roundTripper{}})}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config()
			tc.edit(&cfg)
			w, err := podwatch.New(cfg, tc.onGone, tc.opts...)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.err == "" && w == nil:
				t.Fatal("New returned no Watcher")
			case tc.err != "" && (err == nil || err.Error() != tc.err):
				t.Fatalf("New error:\n got %v\nwant %s", err, tc.err)
			case tc.err != "" && w != nil:
				t.Fatal("New returned a Watcher with an error")
			}
		})
	}
}

// Before Run, Healthy is false since New, on the Watcher's clock.
func TestHealthyBeforeRun(t *testing.T) {
	f := newFakeAPI(t)
	clk := newClock()
	w, err := podwatch.New(f.config(), func(podwatch.Gone) {}, podwatch.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	if ok, since := w.Healthy(); ok || !since.Equal(clk.Now()) {
		t.Errorf("Healthy = %v since %s, want false since New", ok, since)
	}
}

// The backoff doubles from its min to its max, each wait in the upper half
// of its step; a WithBackoff that makes no sense leaves the defaults.
func TestBackoff(t *testing.T) {
	f := newFakeAPI(t)
	for _, tc := range []struct {
		name     string
		opt      podwatch.Option
		min, max time.Duration
	}{
		{"default", nil, 100 * time.Millisecond, 10 * time.Second},
		{"set", podwatch.WithBackoff(time.Second, 3*time.Second), time.Second, 3 * time.Second},
		{"max below min", podwatch.WithBackoff(time.Second, time.Millisecond), 100 * time.Millisecond, 10 * time.Second},
		{"zero", podwatch.WithBackoff(0, time.Second), 100 * time.Millisecond, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []podwatch.Option
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			w, err := podwatch.New(f.config(), func(podwatch.Gone) {}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for n := 1; n <= 12; n++ {
				step := min(tc.min<<(n-1), tc.max)
				for range 50 {
					if d := w.Backoff(n); d < step/2 || d > step {
						t.Fatalf("Backoff(%d) = %s, want within [%s, %s]", n, d, step/2, step)
					}
				}
			}
		})
	}
}
