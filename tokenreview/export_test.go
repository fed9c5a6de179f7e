package tokenreview

import "crypto/sha256"

// Parse is parse, for the fuzz target.
var Parse = parse

// Waiters is how many Reviews wait for the request in flight for token.
func (r *Reviewer) Waiters(token string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.flights[sha256.Sum256([]byte(token))]; f != nil {
		return f.waiters
	}
	return 0
}

// CacheLen is how many answers r remembers.
func (r *Reviewer) CacheLen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cache.len()
}

// SetCacheMax replaces r's cache by an empty one of max entries.
func (r *Reviewer) SetCacheMax(max int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache = newCache(max)
}
