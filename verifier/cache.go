package verifier

// The verified-token cache: a Runner that reconnects presents the token it
// connected with, and a storm of reconnects would otherwise pay the parse
// and the signature check again for every one of them.

import (
	"crypto/sha256"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultVerifiedCacheEntries bounds the verified-token cache: about one
// live token and one rotated-in successor for each of 8,000 Runners, a few
// MiB (an entry is its token's SHA-256 and the Subject, a few hundred
// bytes); the memory is fixed whatever is presented.
const DefaultVerifiedCacheEntries = 16384

// evictScan is how many entries an insert into a full cache looks at for an
// expired one before it evicts whichever came first: bounded work per insert.
const evictScan = 8

// WithVerifiedCache sets how many verified tokens Verify remembers (default
// DefaultVerifiedCacheEntries; 0 turns the cache off).
//
// A remembered token is the exact bytes that passed every check, keyed by
// their SHA-256: presenting it again returns the same Subject without the
// parse and the signature check. An entry is used only while its answer is
// the one Verify would give: from the token's nbf and iat (less Leeway) to
// its exp, never after (from exp on the token is verified again, and refused
// at exp + Leeway as ever); while its cluster is registered unchanged with
// the same deny list; and while the key set it was verified with is the
// cluster's current one and usable. Any key-set load (a refresh, a kid miss,
// a reload) replaces every cluster's key set, so it drops every entry. Only
// successes are remembered: what an attacker presents costs as much as
// before and takes no room.
func WithVerifiedCache(entries int) Option {
	return func(v *RunnerVerifier) { v.cache = newVerifiedCache(entries) }
}

type cacheEntry struct {
	c         *cluster
	snap      *keySnapshot
	deny      *NodeDeny
	notBefore time.Time // max(nbf, iat) - Leeway: earlier, Verify refuses
	sub       Subject
}

type verifiedCache struct {
	max    int
	mu     sync.Mutex
	m      map[[sha256.Size]byte]cacheEntry
	hits   atomic.Uint64
	misses atomic.Uint64
}

// newVerifiedCache returns nil (no cache) for entries <= 0.
func newVerifiedCache(entries int) *verifiedCache {
	if entries <= 0 {
		return nil
	}
	return &verifiedCache{max: entries, m: make(map[[sha256.Size]byte]cacheEntry)}
}

// cached returns the remembered Subject for a token (by its SHA-256), if it
// is still the answer.
func (v *RunnerVerifier) cached(key [sha256.Size]byte) (Subject, bool) {
	vc := v.cache
	vc.mu.Lock()
	e, ok := vc.m[key]
	vc.mu.Unlock()
	if !ok {
		vc.misses.Add(1)
		return Subject{}, false
	}
	now := v.now()
	switch {
	case !now.Before(e.sub.Expiry), now.Before(e.notBefore),
		v.clusters.Load().byName[e.c.cfg.Name] != e.c,
		e.c.snap.Load() != e.snap, v.usable(e.c, e.snap) != nil,
		e.c.life.deny.Load() != e.deny:
		// Left in place: a key set, deny list or cluster it was verified
		// with never comes back, so it cannot answer again (past exp, or
		// before nbf, it is what the full path says too). A successful
		// verification overwrites it, or eviction takes it.
		vc.misses.Add(1)
		return Subject{}, false
	}
	vc.hits.Add(1)
	return e.sub.clone(), true
}

// remember stores a verified token's Subject.
func (v *RunnerVerifier) remember(key [sha256.Size]byte, e cacheEntry) {
	vc := v.cache
	now := v.now()
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if _, ok := vc.m[key]; !ok && len(vc.m) >= vc.max {
		vc.evictLocked(now)
	}
	e.sub = e.sub.clone()
	vc.m[key] = e
}

// evictLocked removes one entry: the first expired one among the first
// evictScan the map hands out (its order is random, so no entry is safe),
// else the first of them. vc.mu must be held.
func (vc *verifiedCache) evictLocked(now time.Time) {
	var victim [sha256.Size]byte
	seen := 0
	for k, e := range vc.m {
		if seen == 0 {
			victim = k
		}
		seen++
		if !now.Before(e.sub.Expiry) {
			victim = k
			break
		}
		if seen == evictScan {
			break
		}
	}
	delete(vc.m, victim)
}

// CacheStats reports the verified-token cache's hits and misses since the
// verifier was made (both 0 with the cache off).
func (v *RunnerVerifier) CacheStats() (hits, misses uint64) {
	if v.cache == nil {
		return 0, 0
	}
	return v.cache.hits.Load(), v.cache.misses.Load()
}

// clone copies the Workload, which the caller may keep or change.
func (s Subject) clone() Subject {
	if s.Workload != nil {
		w := *s.Workload
		s.Workload = &w
	}
	return s
}
