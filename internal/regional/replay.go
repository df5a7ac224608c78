package regional

import (
	"container/list"
	"context"
	"sync"
	"time"

	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// replayCache remembers the decision of a check that carried an idempotency
// key, per subject and key, for ttl, so that a retry returns the first
// decision without charging again. A retry that arrives while the first
// check is still in flight waits for it.
//
// It is an LRU bounded to max entries (the least recently used entry is
// dropped first, in flight or not). Safe for concurrent use.
type replayCache struct {
	mu  sync.Mutex
	max int
	ttl time.Duration
	ll  *list.List
	m   map[string]*list.Element
}

type replayEntry struct {
	key  string
	at   time.Time
	done chan struct{}
	resp *quotav1.CheckResponse // nil until done; nil after done means the owner failed
}

func newReplayCache(max int, ttl time.Duration) *replayCache {
	return &replayCache{max: max, ttl: ttl, ll: list.New(), m: make(map[string]*list.Element)}
}

// begin looks key up at now. It returns either a finished response to
// replay, or an entry the caller now owns and must finish (or abandon with
// a nil response).
func (c *replayCache) begin(ctx context.Context, key string, now time.Time) (*quotav1.CheckResponse, *replayEntry, error) {
	for attempt := 0; attempt < 3; attempt++ {
		c.mu.Lock()
		if el, ok := c.m[key]; ok {
			e := el.Value.(*replayEntry)
			if now.Sub(e.at) < c.ttl {
				c.ll.MoveToFront(el)
				c.mu.Unlock()
				select {
				case <-e.done:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
				if e.resp != nil {
					return e.resp, nil, nil
				}
				continue // the first check failed: try to own it
			}
			c.ll.Remove(el)
			delete(c.m, key)
		}
		e := &replayEntry{key: key, at: now, done: make(chan struct{})}
		c.m[key] = c.ll.PushFront(e)
		for c.ll.Len() > c.max {
			old := c.ll.Back()
			c.ll.Remove(old)
			delete(c.m, old.Value.(*replayEntry).key)
		}
		c.mu.Unlock()
		return nil, e, nil
	}
	// The owners keep failing; decide without the cache.
	return nil, nil, nil
}

// finish publishes the owner's response; nil abandons the entry.
func (c *replayCache) finish(e *replayEntry, resp *quotav1.CheckResponse) {
	if e == nil {
		return
	}
	c.mu.Lock()
	e.resp = resp
	if resp == nil {
		if el, ok := c.m[e.key]; ok && el.Value.(*replayEntry) == e {
			c.ll.Remove(el)
			delete(c.m, e.key)
		}
	}
	c.mu.Unlock()
	close(e.done)
}

func (c *replayCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
