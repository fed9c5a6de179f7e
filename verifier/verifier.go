package verifier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"golang.org/x/sync/singleflight"
)

// RunnerVerifier verifies projected ServiceAccount tokens offline against the
// key sets of the registered clusters. It is safe for concurrent use.
//
// Attacker model: anyone can present any string. Work before the signature check
// is bounded and cheap (length, shape, header, issuer lookup), an unknown issuer
// never causes a fetch, and an unknown kid causes at most one fetch per cluster
// per KIDMissCooldown. Issuers are trusted only for the clusters they are
// registered as; a key published by two clusters fails both closed.
type RunnerVerifier struct {
	tenant string
	now    func() time.Time
	log    *slog.Logger
	onLoad func(LoadEvent)
	// onPodGone is told of each pod a cluster's pod watch saw go
	// (WithPodGone); nil: nobody.
	onPodGone func(cluster string)
	ticker    func(time.Duration) (<-chan time.Time, func())
	client    *http.Client               // the caller's, for the clusters Reload adds
	clusters  atomic.Pointer[clusterSet] // replaced whole by Reload; Verify reads it without locks

	loads   singleflight.Group
	mu      sync.Mutex // guards the mutable fields of every cluster
	started atomic.Bool
	reload  reloadState    // serializes Reload and Start (reload.go)
	cache   *verifiedCache // nil: off (cache.go)
}

type cluster struct {
	cfg    RunnerCluster // its Deny is nil: the deny list is life.deny, which Reload swaps
	client *http.Client
	static bool // jwksFile
	snap   atomic.Pointer[keySnapshot]
	life   clusterLife // what Reload and Start keep (reload.go)
	// loadsBegun numbers the cluster's loads: a load takes the next number
	// before it fetches, so Refetch can tell a load that began after it was
	// called from one already in flight (keyset.go). loadsEnded is the
	// number of the last load that ended (one load at a time: v.loads).
	loadsBegun, loadsEnded atomic.Uint64

	// Guarded by RunnerVerifier.mu.
	raw       []jose.JSONWebKey
	loadedAt  time.Time
	lastErr   error
	lastErrAt time.Time
	lastMiss  time.Time // last fetch triggered by an unknown kid
	discarded bool
}

// Option configures a RunnerVerifier; New takes any number of them, applied
// in order. Each has a default, so a verifier needs only its clusters.
type Option func(*RunnerVerifier)

// WithTenant sets the tenant stamped on every Subject Verify returns
// (Subject.Tenant). compass-server passes its store's bootstrap tenant. The
// default is "": compass-callout stamps none, as Runners are shared across
// tenants.
func WithTenant(tenant string) Option {
	return func(v *RunnerVerifier) { v.tenant = tenant }
}

// WithHTTPClient sets the client whose Transport fetches discovery documents
// and key sets. The default, and what nil leaves in place, is
// http.DefaultTransport. Only the Transport is used: the verifier sets its
// own timeout (FetchTimeout) and redirect policy, and gives a cluster with a
// caFile a clone of the Transport that trusts that CA alone, which New (and
// Reload) refuse when the Transport is not an *http.Transport.
func WithHTTPClient(c *http.Client) Option {
	return func(v *RunnerVerifier) {
		if c != nil {
			v.client = c
		}
	}
}

// WithClock sets the clock tokens are checked against (exp, nbf, iat), and
// by which key sets age (StaleAfter) and the kid-miss cooldown passes. The
// default, and what nil leaves in place, is time.Now.
func WithClock(now func() time.Time) Option {
	return func(v *RunnerVerifier) {
		if now != nil {
			v.now = now
		}
	}
}

// WithLogger sets where key-set events are logged. The default discards them.
func WithLogger(l *slog.Logger) Option {
	return func(v *RunnerVerifier) {
		if l != nil {
			v.log = l
		}
	}
}

// WithLoadHook calls f after every key-set load attempt (for metrics, or for
// tests that wait for a background load). f must not block.
func WithLoadHook(f func(LoadEvent)) Option {
	return func(v *RunnerVerifier) { v.onLoad = f }
}

// WithTicker sets how Start makes its refresh ticker: ticker(d) returns a
// channel that receives every d and a function that stops it. The default is
// time.NewTicker; tests drive the scheduled refresh with their own clock.
func WithTicker(ticker func(d time.Duration) (<-chan time.Time, func())) Option {
	return func(v *RunnerVerifier) {
		if ticker != nil {
			v.ticker = ticker
		}
	}
}

func newRealTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// New builds a verifier for the given clusters (as returned by
// ParseRunnerClusters, which it re-checks), configured by opts: WithTenant,
// WithHTTPClient, WithClock, WithLogger, WithLoadHook, WithTicker,
// WithVerifiedCache. A jwksFile is read here, and an unreadable one is an
// error. With no clusters the verifier refuses every token. It fetches
// nothing: Start (or Refresh) does.
func New(clusters []RunnerCluster, opts ...Option) (*RunnerVerifier, error) {
	v := &RunnerVerifier{
		now:    time.Now,
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		ticker: newRealTicker,
		cache:  newVerifiedCache(DefaultVerifiedCacheEntries),
	}
	for _, o := range opts {
		o(v)
	}
	v.clusters.Store(&clusterSet{})
	if err := v.apply(clusters, true); err != nil {
		return nil, err
	}
	return v, nil
}

// NewRunnerVerifier is New with the tenant, the HTTP client and the clock
// given by position (nil client: http.DefaultTransport; nil clock:
// time.Now), before opts.
//
// Deprecated: use New with WithTenant, WithHTTPClient and WithClock.
func NewRunnerVerifier(clusters []RunnerCluster, tenant string, client *http.Client, now func() time.Time, opts ...Option) (*RunnerVerifier, error) {
	return New(clusters, append([]Option{WithTenant(tenant), WithHTTPClient(client), WithClock(now)}, opts...)...)
}

// Clusters returns the registered cluster names in file order.
func (v *RunnerVerifier) Clusters() []string {
	set := v.clusters.Load()
	names := make([]string, len(set.list))
	for i, c := range set.list {
		names[i] = c.cfg.Name
	}
	return names
}

// Start begins one background fetch per cluster without waiting for it, then
// refreshes every RefreshInterval until ctx ends. Calling it twice is a no-op.
// A cluster that Reload adds later is started the same way; one that Reload
// removes stops.
func (v *RunnerVerifier) Start(ctx context.Context) {
	v.reload.mu.Lock()
	defer v.reload.mu.Unlock()
	if !v.started.CompareAndSwap(false, true) {
		return
	}
	v.reload.runCtx = ctx
	v.startRefresh(v.clusters.Load().list)
	for _, c := range v.clusters.Load().list {
		if r := c.life.review.Load(); r != nil {
			r.pods.start(ctx)
		}
	}
}

// startRefresh starts the refresh goroutine of each fetched (not jwksFile)
// cluster: a fetch now, then one every RefreshInterval, until Start's ctx
// ends or Reload removes the cluster. v.reload.mu must be held.
func (v *RunnerVerifier) startRefresh(clusters []*cluster) {
	for _, c := range clusters {
		if c.static {
			continue
		}
		ctx, done := v.clusterRun(c)
		go func() {
			defer close(done)
			tick, stop := v.ticker(RefreshInterval)
			defer stop()
			why := ReasonStart
			for {
				_ = v.refreshFor(ctx, c, why) // logged and reported by load
				why = ReasonRefresh
				select {
				case <-ctx.Done():
					return
				case <-tick:
				}
			}
		}()
	}
}

// Refresh fetches every cluster's keys now (merged with loads in flight) and
// returns the errors joined. Static clusters are re-read.
func (v *RunnerVerifier) Refresh(ctx context.Context) error {
	var errs []error
	for _, c := range v.clusters.Load().list {
		if err := v.refresh(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("cluster %q: %w", c.cfg.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Status reports each cluster's key-set state, in file order.
func (v *RunnerVerifier) Status() []ClusterStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	set := v.clusters.Load()
	out := make([]ClusterStatus, 0, len(set.list))
	for _, c := range set.list {
		s := c.snap.Load()
		st := ClusterStatus{Name: c.cfg.Name, Static: c.static, Keys: s.count, LoadedAt: s.loadedAt,
			LastErrorAt: c.lastErrAt, SharedWith: slices.Clone(s.sharedWith), Reviews: c.life.review.Load().stats()}
		if c.lastErr != nil {
			st.LastError = c.lastErr.Error()
		}
		if err := v.usable(c, s); err != nil {
			st.Reason = err.Error()
		} else {
			st.Usable = true
		}
		out = append(out, st)
	}
	return out
}
