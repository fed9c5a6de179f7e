package tokenreview

import (
	"container/heap"
	"crypto/sha256"
	"time"
)

// cache remembers answers under their token's SHA-256 until a set instant.
// It is bounded: an insert into a full cache first drops every expired
// entry, then, if none was, the entry expiring soonest. Entries are kept in
// a min-heap by expiry, so both are found at its top and an insert costs
// O(log n). It is not safe for concurrent use: the Reviewer's mutex guards it.
type cache struct {
	max   int
	byKey map[[sha256.Size]byte]*entry
	order byExpiry
}

// entry is one answer: a Result (accepted) or an ErrRejected error.
type entry struct {
	key   [sha256.Size]byte
	res   Result
	err   error
	until time.Time // used while now is before it
	index int       // in cache.order
}

func newCache(max int) *cache {
	return &cache{max: max, byKey: map[[sha256.Size]byte]*entry{}}
}

// get returns the answer for key while it is in force at now, and drops it
// once it is not.
func (c *cache) get(key [sha256.Size]byte, now time.Time) (*entry, bool) {
	e := c.byKey[key]
	if e == nil {
		return nil, false
	}
	if !now.Before(e.until) {
		c.remove(e)
		return nil, false
	}
	return e, true
}

// put remembers an answer until until; one that is already over at now is
// not remembered.
func (c *cache) put(key [sha256.Size]byte, res Result, err error, until, now time.Time) {
	if !until.After(now) || c.max <= 0 {
		return
	}
	if e := c.byKey[key]; e != nil {
		e.res, e.err, e.until = res, err, until
		heap.Fix(&c.order, e.index)
		return
	}
	if len(c.byKey) >= c.max {
		for len(c.order) > 0 && !now.Before(c.order[0].until) {
			c.remove(c.order[0]) // expired
		}
		if len(c.byKey) >= c.max {
			c.remove(c.order[0]) // every entry live: the soonest to expire
		}
	}
	e := &entry{key: key, res: res, err: err, until: until}
	c.byKey[key] = e
	heap.Push(&c.order, e)
}

func (c *cache) remove(e *entry) {
	heap.Remove(&c.order, e.index)
	delete(c.byKey, e.key)
}

func (c *cache) len() int { return len(c.byKey) }

// byExpiry is a container/heap of entries, soonest expiry first.
type byExpiry []*entry

func (h byExpiry) Len() int           { return len(h) }
func (h byExpiry) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h byExpiry) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *byExpiry) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *byExpiry) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
