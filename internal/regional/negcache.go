package regional

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// negativeCache remembers buckets that denied, so that a client ignoring
// Retry-After cannot push its traffic onto Redis.
//
// An entry says: at denial time the bucket (one key, enforced with one
// share and one set of limits) could not admit cost, and would not before
// until. Until then the same bucket is denied locally for any cost at least
// as large, under the same share and limits. Tokens only come back by refill
// (or a refund, which the cache forgets on), so such a request would be
// denied by the store as well: the cache never admits and never denies what
// the store would admit, except for refunds and share growth between the
// denial and until, both of which only shorten the wait.
//
// It is bounded: each of its shards holds at most max/shards entries; a full
// shard first drops expired entries and then refuses new ones. Safe for
// concurrent use.
type negativeCache struct {
	seed   maphash.Seed
	shards [negShards]negShard
	per    int
}

const negShards = 16

type negShard struct {
	mu sync.Mutex
	m  map[bucket.Key]negEntry
}

type negEntry struct {
	until    time.Time
	cost     int64
	share    float64
	limits   bucket.Limits
	limit    float64
	resetAt  time.Time
	remain   float64
	deniedAt time.Time
}

func newNegativeCache(max int) *negativeCache {
	c := &negativeCache{seed: maphash.MakeSeed(), per: max / negShards}
	if max > 0 && c.per == 0 {
		c.per = 1
	}
	for i := range c.shards {
		c.shards[i].m = make(map[bucket.Key]negEntry)
	}
	return c
}

// shard is key's shard, chosen by its subject (a key is keyed by value,
// so no string is built for it).
func (c *negativeCache) shard(key bucket.Key) *negShard {
	return &c.shards[maphash.String(c.seed, key.Subject())%negShards]
}

// deny reports a local denial of req at now when an entry covers it.
func (c *negativeCache) deny(key bucket.Key, req bucket.Request, now time.Time) (bucket.Decision, bool) {
	if c.per == 0 {
		return bucket.Decision{}, false
	}
	s := c.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	if ok && !now.Before(e.until) {
		delete(s.m, key)
		ok = false
	}
	s.mu.Unlock()
	if !ok || req.Cost < e.cost || req.Share != e.share || req.Limits != e.limits {
		return bucket.Decision{}, false
	}
	d := bucket.Decision{Allowed: false, Limit: e.limit, Remaining: e.remain, RetryAfter: e.until.Sub(now)}
	if r := e.resetAt.Sub(now); r > 0 {
		d.ResetAfter = r
	}
	return d, true
}

// add records that the store denied req at now with decision d.
func (c *negativeCache) add(key bucket.Key, req bucket.Request, d bucket.Decision, now time.Time) {
	if c.per == 0 || d.Allowed || d.RetryAfter <= 0 || req.Cost <= 0 {
		return
	}
	e := negEntry{
		until: now.Add(d.RetryAfter), cost: req.Cost, share: req.Share, limits: req.Limits,
		limit: d.Limit, remain: d.Remaining, resetAt: now.Add(d.ResetAfter), deniedAt: now,
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[key]; ok && now.Before(old.until) && old.cost < e.cost && old.share == e.share && old.limits == e.limits {
		// A smaller cost is already known to be denied: that entry covers
		// this request too.
		return
	}
	if _, ok := s.m[key]; !ok && len(s.m) >= c.per {
		for k, v := range s.m {
			if !now.Before(v.until) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= c.per {
			return
		}
	}
	s.m[key] = e
}

// forget drops key, after a refund put tokens back.
func (c *negativeCache) forget(key bucket.Key) {
	if c.per == 0 {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// len returns the number of entries, expired or not.
func (c *negativeCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
