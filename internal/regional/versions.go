package regional

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotacoord/quota/internal/policy"
)

// keyVersions remembers when this node saw each policy's bucket key
// version (policy.KeyVersion) change, so that its checks pass that instant
// as bucket.Request.Since: a policy edit moves every bucket to new keys,
// and a bucket absent under a key younger than its refill time may be one
// whose budget was spent under the old keys. The store reads such a
// bucket as emptied (token bucket) or filled (window algorithms) at the
// edit, instead of handing every subject a fresh full budget.
//
// What it cannot know: a node that starts after the edit (a restart within
// a refill time of it) sees the new version as its first and passes no
// Since; a policy removed and added back with other limits counts as new.
// The nodes that did see the edit still start new buckets conservatively,
// and a bucket one of them wrote is read as written by every node.
type keyVersions struct {
	mu sync.Mutex // serialises update
	// known is each policy's key version in the last set (nil before the
	// first set: the versions of the first set are not changes).
	known map[string]uint32
	// changed holds the policies whose key version changed while this
	// node ran, with the instant; read without a lock on every check.
	// An entry stays until the policy's next change or removal; it is
	// bounded by the policies of the set.
	changed atomic.Pointer[map[string]versionChange]
}

// versionChange is when a policy's key version became version.
type versionChange struct {
	version uint32
	at      time.Time
}

// update records the key versions of s, seen at now.
func (kv *keyVersions) update(s *policy.Set, now time.Time) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	first := kv.known == nil
	known := make(map[string]uint32, s.Len())
	changed := map[string]versionChange{}
	var prev map[string]versionChange
	if p := kv.changed.Load(); p != nil {
		prev = *p
	}
	for _, p := range s.Policies() {
		v := p.KeyVersion()
		known[p.Name] = v
		old, had := kv.known[p.Name]
		switch {
		case first || !had:
		case old != v:
			changed[p.Name] = versionChange{version: v, at: now}
		default:
			if c, ok := prev[p.Name]; ok && c.version == v {
				changed[p.Name] = c
			}
		}
	}
	kv.known = known
	kv.changed.Store(&changed)
}

// since is the bucket.Request.Since of a bucket of p under key version
// version at now: the instant this node saw that version replace another,
// while it is younger than the bucket's idle TTL (which covers its refill
// time: later a new bucket starts as it would anyway); zero otherwise.
func (kv *keyVersions) since(p *policy.Policy, version uint32, now time.Time) time.Time {
	m := kv.changed.Load()
	if m == nil || len(*m) == 0 {
		return time.Time{}
	}
	c, ok := (*m)[p.Name]
	if !ok || c.version != version || now.Sub(c.at) >= p.Limits.IdleTTL || c.at.UnixMicro() <= 0 {
		return time.Time{}
	}
	return c.at
}
