package verifier

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Key-set limits, each with its reason.
const (
	// FetchTimeout bounds each discovery or JWKS request, so that discovery plus
	// JWKS fits inside a Runner's 10 s enrollment attempt.
	FetchTimeout = 3 * time.Second
	// MaxBodyBytes caps a discovery document or JWKS. Real ones are a few KiB; an
	// issuer (or whoever sits on its path) cannot make the Server buffer more.
	MaxBodyBytes = 1 << 20
	// RefreshInterval is the scheduled re-fetch. Operators publish a new key at
	// least this long before signing with it.
	RefreshInterval = time.Hour
	// KIDMissCooldown is the least time between two fetches triggered by tokens
	// with an unknown kid. Issuers are public, so anyone can mint forged-kid
	// tokens; this bounds the fetches they cause to one per cluster per window.
	KIDMissCooldown = 5 * time.Minute
	// StaleAfter is how long the last good key set is kept after fetches start
	// failing. An issuer outage is survived for a day; a cluster whose issuer is
	// gone for longer fails closed rather than trusting keys that may be revoked.
	StaleAfter = 24 * time.Hour
	// MinRSABits is the smallest RSA modulus accepted for RS256.
	MinRSABits = 2048
	// MaxKeysPerSet bounds the keys taken from one JWKS. Kubernetes publishes one
	// per signing key (two during a rotation).
	MaxKeysPerSet = 64
	// maxRedirects bounds the redirects one fetch follows; each must stay on
	// https.
	maxRedirects = 5
	// maxParallelRefetch bounds how many clusters Refetch loads at once. An
	// operator's reload re-fetches every cluster, and a key pulled at the
	// issuer must stop verifying within seconds however many clusters are
	// registered (a hundred are about six rounds of healthy fetches), without
	// opening a connection to each of thousands of issuers at the same instant.
	maxParallelRefetch = 16
)

// keySnapshot is an immutable view of a cluster's keys; Verify reads it without
// locks.
type keySnapshot struct {
	keys       map[string][]jose.JSONWebKey // by kid
	count      int
	loadedAt   time.Time // last successful load; zero when never loaded
	sharedWith []string  // other clusters holding one of these keys; non-empty fails closed
}

// LoadReason says what began a key-set load.
type LoadReason string

// The reasons a key set is loaded.
const (
	// ReasonStart is a fetched cluster's first load: Start's, or that of a
	// cluster Reload adds once Start has been called.
	ReasonStart LoadReason = "start"
	// ReasonRefresh is the refresh every RefreshInterval, and Refresh.
	ReasonRefresh LoadReason = "refresh"
	// ReasonKIDMiss is a token whose kid the key set does not have (at most
	// one load per cluster per KIDMissCooldown).
	ReasonKIDMiss LoadReason = "kid-miss"
	// ReasonOperator is Refetch: the operator's SIGHUP, or a changed cluster
	// file.
	ReasonOperator LoadReason = "operator"
)

// LoadEvent reports one load attempt of a cluster's key set.
type LoadEvent struct {
	Cluster string
	// Reason is what began the load. Callers merged into a load in flight
	// are not named: a kid miss that joins the hourly refresh is reported
	// once, as ReasonRefresh. It is empty for the read of a jwksFile when
	// New or Reload sets its cluster up.
	Reason     LoadReason
	Err        error    // nil on success
	Keys       int      // usable keys now held (0 when none or discarded)
	SharedWith []string // clusters sharing a key; the cluster is failing closed when non-empty
}

// ClusterStatus is a cluster's key-set state, for metrics and health checks.
type ClusterStatus struct {
	Name        string
	Static      bool // keys from jwksFile; never fetched
	Keys        int
	LoadedAt    time.Time // zero when never loaded
	LastError   string    // "" after a successful load
	LastErrorAt time.Time
	// Usable is false when the cluster answers ErrKeysUnavailable; Reason says why.
	Usable     bool
	Reason     string
	SharedWith []string
	// Reviews are the cluster's token reviews (nil: no tokenReview).
	Reviews *ReviewStats
}

// refresh loads the cluster's keys now, merged with any load already in flight.
// It waits at most until ctx ends; the load itself carries on (bounded by
// FetchTimeout) for the callers merged into it.
func (v *RunnerVerifier) refresh(ctx context.Context, c *cluster) error {
	return v.refreshFor(ctx, c, ReasonRefresh)
}

// refreshFor is refresh with the reason a load it begins is reported with.
func (v *RunnerVerifier) refreshFor(ctx context.Context, c *cluster, why LoadReason) error {
	_, err := v.joinLoad(ctx, c, why)
	return err
}

// joinLoad joins the cluster's load in flight, or begins one (reported with
// why), and waits for it at most until ctx ends. It returns the load's number
// (see cluster.loadsBegun; 0 when ctx ended first) and its error.
func (v *RunnerVerifier) joinLoad(ctx context.Context, c *cluster, why LoadReason) (uint64, error) {
	ch := v.loads.DoChan(c.life.key, func() (any, error) {
		n := c.loadsBegun.Add(1) // before the fetch: see refetch
		err := v.load(context.WithoutCancel(ctx), c, why)
		c.loadsEnded.Store(n)
		return n, err
	})
	select {
	case r := <-ch:
		n, _ := r.Val.(uint64)
		return n, r.Err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Refetch loads every cluster's key set again now, as the operator asks it
// (compass-server and compass-callout call it on SIGHUP and when the cluster
// file changed): a key removed at an issuer, a leaked one, stops verifying
// when Refetch returns, rather than at the hourly refresh. jwksFile clusters
// are read again.
//
// Each cluster's set comes from a fetch that begins after Refetch is
// called. The rule of one load per cluster at a time holds: a load that
// began after the call is joined; one that began before (its answer may
// predate the key's removal) is waited for, and a new one begun after it.
// The kid-miss cooldown neither stops these loads nor is used up by them:
// it bounds the fetches the public can cause with forged kids, and an
// operator's request is not that. Everything else is as for any load: a
// failed fetch keeps the last good key set (StaleAfter still applies), the
// shared-key check runs over every cluster, each outcome is logged and
// reported to the load hook with ReasonOperator, and every verified-token
// cache entry is dropped.
//
// Up to maxParallelRefetch clusters load at once. Refetch waits until every
// cluster has loaded or ctx ends; a load it began carries on after ctx ends
// (each request is bounded by FetchTimeout). It returns the failures joined,
// each naming its cluster.
func (v *RunnerVerifier) Refetch(ctx context.Context) error {
	list := v.clusters.Load().list
	errs := make([]error, len(list))
	slots := make(chan struct{}, maxParallelRefetch)
	var wg sync.WaitGroup
	for i, c := range list {
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
				errs[i] = v.refetch(ctx, c)
			case <-ctx.Done():
				errs[i] = ctx.Err()
			}
			if errs[i] != nil {
				errs[i] = fmt.Errorf("verifier: cluster %q: key re-fetch: %w", c.cfg.Name, errs[i])
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// refetch waits for a load of c that began after it was called (see
// Refetch), beginning one when none is in flight.
func (v *RunnerVerifier) refetch(ctx context.Context, c *cluster) error {
	// A load numbered above asked began after this line: its fetch is the
	// issuer's answer from now on.
	asked := c.loadsBegun.Load()
	if c.loadsEnded.Load() < asked {
		// Said, because the operator waits for it: at worst two loads,
		// each bounded by FetchTimeout per request.
		v.log.Info("runner cluster key re-fetch waits for a load that began before the operator's request",
			"cluster", c.cfg.Name)
	}
	for {
		n, err := v.joinLoad(ctx, c, ReasonOperator)
		if n > asked || ctx.Err() != nil {
			return err
		}
		// The load joined began before the request; it is over (and out of
		// the flight group) now, so the next join begins a new one or joins
		// one that began after it.
	}
}

// load fetches (or reads) a key set and installs it, then recomputes the
// cross-cluster shared-key check.
func (v *RunnerVerifier) load(ctx context.Context, c *cluster, why LoadReason) error {
	keys, err := v.fetchKeys(ctx, c)
	v.install(c, keys, err, why)
	return err
}

// install records a load attempt's outcome and recomputes every snapshot.
func (v *RunnerVerifier) install(c *cluster, keys []jose.JSONWebKey, err error, why LoadReason) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if c.life.removed {
		return // Reload removed the cluster while this load was in flight
	}
	now := v.now()
	var dropped []string // kids of the last good set that this one lacks
	if err != nil {
		c.lastErr, c.lastErrAt = err, now
		v.log.Warn("runner cluster key fetch failed", "cluster", c.cfg.Name, "reason", why, "error", err)
	} else {
		dropped = droppedKIDs(c.raw, keys)
		c.raw, c.loadedAt, c.lastErr = keys, now, nil
	}
	v.recomputeLocked(now)
	s := c.snap.Load()
	if err == nil && why == ReasonOperator {
		// The operator asked for this load, usually to pull a key: say
		// what is trusted now. Kids are public (the JWKS publishes them).
		v.log.Info("runner cluster keys re-fetched on the operator's request", "cluster", c.cfg.Name,
			"reason", why, "keys", s.count, "kids", kidsOf(keys), "dropped_kids", dropped)
	}
	if v.onLoad != nil {
		v.onLoad(LoadEvent{Cluster: c.cfg.Name, Reason: why, Err: err, Keys: s.count, SharedWith: slices.Clone(s.sharedWith)})
	}
}

// kidsOf returns the distinct kids of keys, sorted.
func kidsOf(keys []jose.JSONWebKey) []string {
	var kids []string
	for _, k := range keys {
		kids = append(kids, k.KeyID)
	}
	slices.Sort(kids)
	return slices.Compact(kids)
}

// droppedKIDs returns the kids of old that next does not have, sorted.
func droppedKIDs(old, next []jose.JSONWebKey) []string {
	have := kidsOf(next)
	var out []string
	for _, kid := range kidsOf(old) {
		if _, found := slices.BinarySearch(have, kid); !found {
			out = append(out, kid)
		}
	}
	return out
}

// recomputeLocked rebuilds every cluster's snapshot: it drops stale sets and
// fails closed every cluster that holds a key (by RFC 7638 thumbprint, whatever
// its kid) also held by another cluster. v.mu must be held.
func (v *RunnerVerifier) recomputeLocked(now time.Time) {
	holders := map[string][]string{}   // thumbprint -> cluster names
	clusters := v.clusters.Load().list // Reload swaps the set under v.mu
	current := make([][]jose.JSONWebKey, len(clusters))
	thumbs := make([][]string, len(clusters)) // each cluster's distinct thumbprints
	for i, c := range clusters {
		if c.raw != nil && !c.static && now.Sub(c.loadedAt) > StaleAfter {
			v.log.Error("runner cluster keys discarded: no successful fetch within the stale limit",
				"cluster", c.cfg.Name, "loaded_at", c.loadedAt, "stale_after", StaleAfter)
			c.raw = nil
			c.discarded = true
		}
		current[i] = c.raw
		for _, k := range c.raw {
			tp, err := k.Thumbprint(crypto.SHA256)
			if err != nil || slices.Contains(thumbs[i], string(tp)) {
				continue
			}
			thumbs[i] = append(thumbs[i], string(tp))
			holders[string(tp)] = append(holders[string(tp)], c.cfg.Name)
		}
	}
	for i, c := range clusters {
		var shared []string
		for _, tp := range thumbs[i] {
			for _, name := range holders[tp] {
				if name != c.cfg.Name && !slices.Contains(shared, name) {
					shared = append(shared, name)
				}
			}
		}
		slices.Sort(shared)
		old := c.snap.Load()
		if len(shared) > 0 && !slices.Equal(shared, old.sharedWith) {
			v.log.Error("runner cluster fails closed: a signing key is shared with another cluster",
				"cluster", c.cfg.Name, "shared_with", strings.Join(shared, ","))
		} else if len(shared) == 0 && len(old.sharedWith) > 0 {
			v.log.Info("runner cluster no longer shares a signing key", "cluster", c.cfg.Name)
		}
		s := &keySnapshot{keys: map[string][]jose.JSONWebKey{}, sharedWith: shared}
		if current[i] != nil {
			s.loadedAt = c.loadedAt
		}
		for _, k := range current[i] {
			s.keys[k.KeyID] = append(s.keys[k.KeyID], k)
			s.count++
		}
		c.snap.Store(s)
	}
}

// usable says why a snapshot cannot verify anything, or nil.
func (v *RunnerVerifier) usable(c *cluster, s *keySnapshot) error {
	switch {
	case s.loadedAt.IsZero():
		if c.discarded {
			return errStale
		}
		return errNeverFetched
	case !c.static && v.now().Sub(s.loadedAt) > StaleAfter:
		return errStale
	case len(s.sharedWith) > 0:
		return errSharedKey
	}
	return nil
}
