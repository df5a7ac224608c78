package regional

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// replayCache remembers the decision of a check that carried an idempotency
// key, per subject and key, for ttl, so that a retry returns the first
// decision without charging again. A retry that arrives while the first
// check is still in flight waits for it.
//
// Each entry is bound to the fingerprint of the request that created it
// (see requestFingerprint): a key presented with another request (other
// policies, cost or peek flag) is errKeyReused, never the first decision,
// so a peek cannot be replayed as an admitted, uncharged check.
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
	fp   fingerprint
	at   time.Time
	done chan struct{}
	resp *quotav1.CheckResponse // nil until done; nil after done means the owner failed
}

func newReplayCache(max int, ttl time.Duration) *replayCache {
	return &replayCache{max: max, ttl: ttl, ll: list.New(), m: make(map[string]*list.Element)}
}

// errKeyReused reports an idempotency key presented with a request other
// than the one it was first used for.
var errKeyReused = errors.New("regional: idempotency key reused for a different request")

// begin looks key up at now for a request with fingerprint fp. It returns
// either a finished response to replay, or an entry the caller now owns
// and must finish (or abandon with a nil response). A live entry of key
// with another fingerprint is errKeyReused.
func (c *replayCache) begin(ctx context.Context, key string, fp fingerprint, now time.Time) (*quotav1.CheckResponse, *replayEntry, error) {
	for attempt := 0; attempt < 3; attempt++ {
		c.mu.Lock()
		if el, ok := c.m[key]; ok {
			e := el.Value.(*replayEntry)
			if now.Sub(e.at) < c.ttl {
				if e.fp != fp {
					c.mu.Unlock()
					return nil, nil, errKeyReused
				}
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
		e := &replayEntry{key: key, fp: fp, at: now, done: make(chan struct{})}
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

// fingerprint identifies what a check asks for, apart from its subject
// and idempotency key (which name the replay entry).
type fingerprint [16]byte

// requestFingerprint is the fingerprint of a check of the policies names,
// in order, at cost (0 for a peek) with the peek flag: the first 16 bytes
// of a SHA-256 over their length-prefixed encoding.
func requestFingerprint(names []string, cost int64, peek bool) fingerprint {
	h := sha256.New()
	var buf [8]byte
	for _, name := range names {
		binary.BigEndian.PutUint64(buf[:], uint64(len(name)))
		h.Write(buf[:])
		h.Write([]byte(name))
	}
	binary.BigEndian.PutUint64(buf[:], uint64(cost))
	h.Write(buf[:])
	if peek {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	var fp fingerprint
	copy(fp[:], h.Sum(nil))
	return fp
}
