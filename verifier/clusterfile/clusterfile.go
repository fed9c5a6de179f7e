// Package clusterfile is how compass-server and compass-callout hold their
// trust root, the cluster file (DL-440's --runner-clusters), by one rule:
//
//   - at start, Open reads and checks the file, runs the start-up guard on
//     minted Runner IDs with "/", and builds the verifier; any error there
//     stops the daemon;
//   - while it runs, Run reloads the file on SIGHUP and whenever the file
//     changes, including a Kubernetes ConfigMap update, which replaces the
//     file through a symlink swap. A new file that does not parse, fails a
//     check or fails the guard is refused whole: the clusters in force stay
//     in force, and a log line (with the path and the reason) and the
//     compass_cluster_file_* metrics say so. Key sets of unchanged clusters
//     survive a reload (verifier.RunnerVerifier.Reload);
//   - whenever it reads the file (every SIGHUP; a poll that saw the file
//     change), applied or not, it then fetches every cluster's key set
//     again (verifier.RunnerVerifier.Refetch), so that a signing key
//     removed at an issuer, a leaked one, stops verifying within seconds
//     rather than at the hourly refresh.
//
// Attacker model: the file is operator-owned configuration, not input from
// Runners; the reload exists so that denying a node (the file's per-cluster
// deny list), registering a cluster or pulling a signing key takes effect
// without a restart, and it must never leave a daemon with a half-applied
// trust root. Only the operator (a signal, or write access to the file) can
// cause the re-fetch, so it is not rate-limited as kid misses are.
package clusterfile

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/verifier"
)

// DefaultPollInterval is how often Run looks at the file's identity (one
// stat; the file is read only when that changed). The kubelet takes up to a
// minute or more to project a ConfigMap update, so a few seconds more costs
// an operator nothing, and a stat every 10 s costs the daemon nothing.
const DefaultPollInterval = 10 * time.Second

// RefetchWait bounds how long a reload waits for the key sets it fetches
// again. A load is discovery plus JWKS, each at most verifier.FetchTimeout
// (3 s), and the re-fetch of a cluster may first wait out a load already in
// flight: 4 x 3 s = 12 s, and a little more. A healthy issuer answers in
// milliseconds; the wait matters only when one stalls, and then Run goes
// back to its signals and polls while that load ends on its own.
const RefetchWait = 15 * time.Second

// Config configures Open.
type Config struct {
	// Path is the cluster file. Empty: Clusters are registered and never
	// reloaded (dev mode and tests).
	Path     string
	Clusters []verifier.RunnerCluster

	// Store, when set, holds minted Runner tokens: with clusters
	// registered, none of them may have "/" in its ID (DL-440), at start and
	// at every reload.
	Store verifier.SlashIDCounter

	// Tenant, HTTPClient and Now configure the verifier (verifier.WithTenant,
	// WithHTTPClient and WithClock; nil or empty: their defaults), Options
	// after them. Now is the registry's clock too.
	Tenant     string
	HTTPClient *http.Client
	Now        func() time.Time
	Options    []verifier.Option

	// Logger receives reload outcomes (nil: discarded).
	Logger *slog.Logger
	// PollInterval: 0 means DefaultPollInterval.
	PollInterval time.Duration
	// Ticker, for tests, replaces the poll's time.Ticker.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	// Signals, for tests, replaces SIGHUP as the forced-reload trigger.
	Signals <-chan os.Signal
	// OnApply, if set, is called after a changed file was applied (before
	// the key sets are fetched again, with the registry's lock held), and
	// again after every re-fetch of the key sets: it must not block. The
	// callout sweeps its live connections from it.
	OnApply func()
}

// ErrRefused wraps every reason a new cluster file was not applied.
var ErrRefused = errors.New("clusterfile: new cluster file refused; the clusters in force stay in force")

// Registry is the daemon's registered clusters and what keeps them in step
// with the file.
type Registry struct {
	cfg Config
	v   *verifier.RunnerVerifier
	log *slog.Logger
	now func() time.Time

	mu       sync.Mutex // serializes reloads and guards what follows
	id       fileID     // identity of the file last read
	digest   [sha256.Size]byte
	failing  bool      // the file on disk was refused; the one before is in force
	loadedAt time.Time // when the clusters in force were applied
	ok, bad  float64   // reload outcomes
}

// fileID is what changes when a file is edited in place or replaced (a
// ConfigMap's symlink swap points the path at a new inode).
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path) // follows the symlinks a ConfigMap volume uses
	if err != nil {
		return fileID{}, err
	}
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino // Dev is not uint64 on every platform
	}
	return id, nil
}

// Open reads the cluster file (or takes cfg.Clusters), runs the guard and
// builds the verifier (not yet started). Its errors are start-up errors.
func Open(ctx context.Context, cfg Config) (*Registry, error) {
	r := &Registry{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.now == nil {
		r.now = time.Now
	}
	clusters := cfg.Clusters
	if cfg.Path != "" {
		id, data, cs, err := read(cfg.Path)
		if err != nil {
			return nil, err
		}
		clusters, r.id, r.digest = cs, id, sha256.Sum256(data)
	}
	if err := verifier.CheckReservedRunnerIDs(ctx, cfg.Store, len(clusters)); err != nil {
		return nil, err
	}
	opts := []verifier.Option{verifier.WithTenant(cfg.Tenant), verifier.WithHTTPClient(cfg.HTTPClient), verifier.WithClock(cfg.Now)}
	v, err := verifier.New(clusters, append(opts, cfg.Options...)...)
	if err != nil {
		return nil, err
	}
	r.v, r.loadedAt = v, r.now()
	return r, nil
}

// read reads the file and its identity, then parses it. The identity is
// taken before the read, so a change that lands during the read is seen
// again by the next poll; it is returned whenever the stat succeeded, so a
// refused file is known by its identity too.
func read(path string) (fileID, []byte, []verifier.RunnerCluster, error) {
	id, err := statID(path)
	if err != nil {
		return fileID{}, nil, nil, fmt.Errorf("verifier: cluster file: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return id, nil, nil, fmt.Errorf("verifier: cluster file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, verifier.MaxClusterFileBytes+1))
	if err != nil {
		return id, nil, nil, fmt.Errorf("verifier: cluster file %s: %w", path, err)
	}
	cs, err := verifier.ParseRunnerClusters(data)
	if err != nil {
		return id, data, nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return id, data, cs, nil
}

// Verifier is the registered clusters' verifier.
func (r *Registry) Verifier() *verifier.RunnerVerifier { return r.v }

// Reload reads the file now and applies it unless it is refused (an error
// wrapping ErrRefused, logged with the path and the reason). A file whose
// bytes are unchanged is not applied again. Applied, unchanged or refused,
// every cluster in force then has its key set fetched again, waiting at most
// RefetchWait (the failures are returned too, wrapping ErrRefetch). Without
// a Path it does nothing.
func (r *Registry) Reload(ctx context.Context) error {
	return r.reload(ctx, true, "reload")
}

// ErrRefetch wraps the failures of the key-set re-fetch after a reload: the
// clusters named keep their last good key sets.
var ErrRefetch = errors.New("clusterfile: key sets not fetched again; the last good ones stay in force")

// reload reads the file when forced or when its identity changed and, if it
// read it, fetches every cluster's key set again. trigger names the cause
// in the log.
func (r *Registry) reload(ctx context.Context, force bool, trigger string) error {
	if r.cfg.Path == "" {
		return nil
	}
	readIt, err := r.reloadFile(ctx, force)
	if !readIt {
		return err
	}
	err = errors.Join(err, r.refetch(ctx, trigger))
	if r.cfg.OnApply != nil {
		// The key sets in force changed too: a pulled key's connections go.
		r.cfg.OnApply()
	}
	return err
}

// refetch fetches every cluster's key set again (after the file was read,
// whatever came of it), waiting at most RefetchWait, and logs the outcome.
func (r *Registry) refetch(ctx context.Context, trigger string) error {
	ctx, cancel := context.WithTimeout(ctx, RefetchWait)
	defer cancel()
	if err := r.v.Refetch(ctx); err != nil {
		r.log.Warn("clusterfile: key sets not fetched again; the last good ones stay in force",
			"path", r.cfg.Path, "trigger", trigger, "error", err)
		return fmt.Errorf("%w: %w", ErrRefetch, err)
	}
	r.log.Info("clusterfile: key sets fetched again", "path", r.cfg.Path, "trigger", trigger, "clusters", r.v.Clusters())
	return nil
}

// reloadFile reads the file when forced or when its identity changed, and
// applies it unless its bytes are unchanged or it is refused. It reports
// whether it read the file.
func (r *Registry) reloadFile(ctx context.Context, force bool) (readIt bool, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !force {
		id, err := statID(r.cfg.Path)
		if err == nil && id == r.id {
			return false, nil
		}
		// A stat error is reported by the read below, once per identity.
		if err != nil && r.failing && r.id == (fileID{}) {
			return false, nil
		}
	}
	id, data, clusters, err := read(r.cfg.Path)
	if err == nil {
		digest := sha256.Sum256(data)
		if digest == r.digest && !r.failing {
			r.id = id
			return true, nil
		}
		if err = verifier.CheckReservedRunnerIDs(ctx, r.cfg.Store, len(clusters)); err == nil {
			err = r.v.Reload(clusters)
		}
		if err == nil {
			r.id, r.digest, r.failing, r.loadedAt = id, digest, false, r.now()
			r.ok++
			r.log.Info("clusterfile: cluster file applied", "path", r.cfg.Path, "clusters", r.v.Clusters())
			if r.cfg.OnApply != nil {
				r.cfg.OnApply()
			}
			return true, nil
		}
	}
	// Remember the identity refused, so a poll does not refuse it again
	// every interval; a fix (a new identity) or SIGHUP reads it again.
	r.id, r.failing = id, true
	r.bad++
	r.log.Error("clusterfile: new cluster file refused; the clusters in force stay in force",
		"path", r.cfg.Path, "error", err, "clusters", r.v.Clusters())
	return true, fmt.Errorf("%w: %w", ErrRefused, err)
}

// Run reloads the file on SIGHUP (always) and when a poll sees it changed,
// each time followed by a re-fetch of every cluster's key set (see Reload),
// until ctx ends. It returns at once without a Path.
func (r *Registry) Run(ctx context.Context) {
	if r.cfg.Path == "" {
		return
	}
	sig := r.cfg.Signals
	if sig == nil {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		sig = hup
	}
	interval := r.cfg.PollInterval
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	ticker := r.cfg.Ticker
	if ticker == nil {
		ticker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	tick, stop := ticker(interval)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			r.log.Info("clusterfile: SIGHUP: reloading the cluster file", "path", r.cfg.Path)
			_ = r.reload(ctx, true, "SIGHUP") // logged
		case <-tick:
			_ = r.reload(ctx, false, "file changed") // logged
		}
	}
}

var (
	descReloads = prometheus.NewDesc("compass_cluster_file_reloads_total",
		"Reloads of the cluster file that read a changed file, by result: applied, or refused (the clusters in force stayed in force).",
		[]string{"result"}, nil)
	descFailing = prometheus.NewDesc("compass_cluster_file_reload_failing",
		"1 while the cluster file on disk is refused and an older one is in force, else 0.", nil, nil)
	descApplied = prometheus.NewDesc("compass_cluster_file_applied_timestamp_seconds",
		"Unix time the clusters in force were applied (at start, or by the last applied reload).", nil, nil)
)

// Describe implements prometheus.Collector.
func (r *Registry) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReloads
	ch <- descFailing
	ch <- descApplied
}

// Collect implements prometheus.Collector.
func (r *Registry) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	ok, bad, failing, at := r.ok, r.bad, r.failing, r.loadedAt
	r.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descReloads, prometheus.CounterValue, ok, "applied")
	ch <- prometheus.MustNewConstMetric(descReloads, prometheus.CounterValue, bad, "refused")
	f := 0.0
	if failing {
		f = 1
	}
	ch <- prometheus.MustNewConstMetric(descFailing, prometheus.GaugeValue, f)
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
}
