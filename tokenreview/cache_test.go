package tokenreview

import (
	"crypto/sha256"
	"math/rand/v2"
	"testing"
	"time"
)

func key(i int) [sha256.Size]byte { return sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(i >> 16)}) }

// A full cache drops its expired entries first, then the entry expiring
// soonest; it never holds more than its bound.
func TestCacheEviction(t *testing.T) {
	t0 := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name  string
		until []int // the entries 0..n-1 put at t0, until t0+until[i] s
		now   int   // when entry n is put (until t0+1000 s)
		kept  []int // the entries left, n included
	}{
		{"not full", []int{10, 20}, 0, []int{0, 1, 2}},
		{"full of live entries: the soonest to expire goes", []int{30, 10, 20}, 0, []int{0, 2, 3}},
		{"full, two expired: both go", []int{5, 50, 6}, 7, []int{1, 3}},
		{"full, one expired though not the oldest put", []int{50, 60, 5}, 6, []int{0, 1, 3}},
		{"expiring at now counts as expired", []int{50, 7, 60}, 7, []int{0, 2, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(3)
			for i, u := range tc.until {
				c.put(key(i), Result{PodName: "p"}, nil, at(u), t0)
			}
			n := len(tc.until)
			c.put(key(n), Result{PodName: "p"}, nil, at(1000), at(tc.now))
			if c.len() != len(tc.kept) {
				t.Fatalf("%d entries, want %d", c.len(), len(tc.kept))
			}
			for _, i := range tc.kept {
				if c.byKey[key(i)] == nil {
					t.Errorf("entry %d was dropped", i)
				}
			}
		})
	}
}

// get drops an entry from its until on; put refuses one already over and
// replaces one of the same key in place.
func TestCacheGetPut(t *testing.T) {
	t0 := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	c := newCache(2)
	c.put(key(1), Result{PodName: "a"}, nil, t0, t0)
	if c.len() != 0 {
		t.Fatal("an answer already over was kept")
	}
	c.put(key(1), Result{PodName: "a"}, nil, t0.Add(time.Second), t0)
	c.put(key(1), Result{PodName: "b"}, nil, t0.Add(2*time.Second), t0)
	if c.len() != 1 {
		t.Fatalf("%d entries after two puts of one key, want 1", c.len())
	}
	if e, ok := c.get(key(1), t0.Add(2*time.Second-1)); !ok || e.res.PodName != "b" {
		t.Fatalf("get before until = %+v, %v; want the second answer", e, ok)
	}
	if _, ok := c.get(key(1), t0.Add(2*time.Second)); ok || c.len() != 0 {
		t.Fatalf("get at until = %v, %d entries; want a miss that drops the entry", ok, c.len())
	}
}

// Whatever is put, at whatever times, the cache stays within its bound, its
// heap in order and its index consistent; when it had to drop a live entry,
// no live entry expired sooner.
func TestCacheBoundProperty(t *testing.T) {
	const max = 64
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	c := newCache(max)
	now := t0
	for i := range 20000 {
		now = now.Add(time.Duration(rng.IntN(100)) * time.Millisecond)
		k := key(rng.IntN(500))
		if rng.IntN(4) == 0 {
			c.get(k, now)
			continue
		}
		var soonest time.Time
		full := c.len() == max && c.byKey[k] == nil
		for _, e := range c.byKey {
			if now.Before(e.until) && (soonest.IsZero() || e.until.Before(soonest)) {
				soonest = e.until
			}
		}
		anyExpired := false
		for _, e := range c.byKey {
			if !now.Before(e.until) {
				anyExpired = true
			}
		}
		before := map[[sha256.Size]byte]time.Time{}
		for kk, e := range c.byKey {
			before[kk] = e.until
		}
		c.put(k, Result{}, nil, now.Add(time.Duration(1+rng.IntN(20000))*time.Millisecond), now)
		if c.len() > max {
			t.Fatalf("step %d: %d entries, bound %d", i, c.len(), max)
		}
		if full && !anyExpired {
			for kk, u := range before {
				if c.byKey[kk] == nil && u.After(soonest) {
					t.Fatalf("step %d: dropped an entry until %s while one until %s was live", i, u, soonest)
				}
			}
		}
		if len(c.order) != len(c.byKey) {
			t.Fatalf("step %d: heap %d, map %d", i, len(c.order), len(c.byKey))
		}
		for j, e := range c.order {
			if e.index != j || c.byKey[e.key] != e {
				t.Fatalf("step %d: heap entry %d inconsistent", i, j)
			}
			if j > 0 && e.until.Before(c.order[(j-1)/2].until) {
				t.Fatalf("step %d: heap out of order at %d", i, j)
			}
		}
	}
}
