package regional

import (
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotacoord/quota/internal/policy"
)

// OverflowSubject is the subject of a policy's shared overflow bucket: the
// bucket every subject beyond the policy's live-subject bound is charged
// to (see liveSubjects).
const OverflowSubject = "_overflow"

// subjectVerdict says how a check's subject is charged under a policy.
type subjectVerdict uint8

const (
	// subjectOwn: the subject keeps a bucket of its own.
	subjectOwn subjectVerdict = iota
	// subjectOverflow: the subject is new and the policy holds its bound
	// of live subjects: it is charged to the overflow bucket.
	subjectOverflow
	// subjectRefused: the store recently refused to grow (Redis OOM, or
	// the in-process store at its cap) and the subject holds no bucket:
	// the check is denied here, without asking the store.
	subjectRefused
)

// liveSubjects bounds, per policy, the subjects this node lets hold a
// bucket of their own. Every new subject creates a bucket that lives at
// least one full refill, so without a bound a flood of random API keys,
// addresses or descriptor values fills the store. A subject is live from
// its first check until its bucket could have expired (the policy's idle
// TTL, or one full refill) after its last check; each policy keeps at
// most max live subjects, and a new subject beyond them is charged to the
// policy's overflow bucket (OverflowSubject) with the policy's limits, so
// the flood shares one budget and is denied beyond it.
//
// When the store refuses to grow (ErrMemoryFull), the policy's new
// subjects, overflow included, are denied for a cooldown without asking
// the store; live subjects keep asking it.
//
// Memory is bounded by max entries per policy, and policies by the policy
// set (forget drops those no longer in it). Safe for concurrent use; a
// check takes one read lock and one lock of a shard of its policy.
type liveSubjects struct {
	max int
	mu  sync.RWMutex
	// byPolicy is keyed by policy name and bucket key version.
	byPolicy map[policyKey]*subjectSet
}

type policyKey struct {
	name    string
	version uint32
}

// subjectSet is one policy's live subjects, in shards by subject hash so
// that checks of one hot policy do not queue on one lock. Each shard holds
// at most per subjects, so the policy holds at most max.
type subjectSet struct {
	seed   maphash.Seed
	shards []subjectShard
	per    int
	ttl    time.Duration
	// fullUntil (unix nanoseconds): new subjects are refused before it.
	fullUntil atomic.Int64
}

// subjectShard is a part of a policy's live subjects, soonest to expire
// first. A subject stays listed at least ttl after its last check.
//
// The map points at the entries themselves, which carry their own list
// links and their expiry in unix nanoseconds: a check of a live subject
// reads the map and one entry (container/list took an element, its
// boxed value and a time.Time to get there).
type subjectShard struct {
	mu sync.Mutex
	m  map[string]*liveEntry
	// head expires first, tail last.
	head, tail *liveEntry
}

type liveEntry struct {
	subject    string
	expires    int64 // unix nanoseconds
	prev, next *liveEntry
}

// pushBack appends e, which is in no list, at the tail.
func (sh *subjectShard) pushBack(e *liveEntry) {
	e.prev, e.next = sh.tail, nil
	if sh.tail != nil {
		sh.tail.next = e
	} else {
		sh.head = e
	}
	sh.tail = e
}

// unlink takes e out of the list.
func (sh *subjectShard) unlink(e *liveEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

// drop removes e from the shard.
func (sh *subjectShard) drop(e *liveEntry) {
	sh.unlink(e)
	delete(sh.m, e.subject)
}

// shardedFrom is the least bound split into subjectShards shards; a
// smaller one is kept in one shard so that it stays exact.
const (
	subjectShards = 16
	shardedFrom   = 1024
)

func newLiveSubjects(max int) *liveSubjects {
	return &liveSubjects{max: max, byPolicy: make(map[policyKey]*subjectSet)}
}

// set returns p's subject set, created on first use.
func (l *liveSubjects) set(p *policy.Policy) *subjectSet {
	k := policyKey{p.Name, p.KeyVersion()}
	l.mu.RLock()
	s := l.byPolicy[k]
	l.mu.RUnlock()
	if s != nil {
		return s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s = l.byPolicy[k]; s == nil {
		s = newSubjectSet(l.max, max(p.Limits.IdleTTL, fullAfter(p.Limits)))
		l.byPolicy[k] = s
	}
	return s
}

func newSubjectSet(max int, ttl time.Duration) *subjectSet {
	if ttl <= 0 {
		ttl = time.Minute
	}
	n := 1
	if max >= shardedFrom {
		n = subjectShards
	}
	s := &subjectSet{seed: maphash.MakeSeed(), shards: make([]subjectShard, n), per: max / n, ttl: ttl}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*liveEntry)
	}
	return s
}

// forget drops the sets of policies that are not in set.
func (l *liveSubjects) forget(set *policy.Set) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.byPolicy {
		if p, ok := set.Get(k.name); !ok || p.KeyVersion() != k.version {
			delete(l.byPolicy, k)
		}
	}
}

func (s *subjectSet) shard(subject string) *subjectShard {
	if len(s.shards) == 1 {
		return &s.shards[0]
	}
	return &s.shards[maphash.String(s.seed, subject)%uint64(len(s.shards))]
}

// maxExpiredPerAdmit bounds the expired entries one admit drops, so that
// a check's cost stays constant; entries are dropped at least as fast as
// new ones come.
const maxExpiredPerAdmit = 4

// admit records a check of subject at now and says how it is charged;
// fresh is true when the check made the subject live (it held no bucket
// this node knew of).
func (s *subjectSet) admit(subject string, now time.Time) (v subjectVerdict, fresh bool) {
	sh := s.shard(subject)
	at, ttl := now.UnixNano(), int64(s.ttl)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[subject]; ok {
		if at < e.expires {
			// Moving an entry to the back on every check cost a list
			// operation per check; an entry is moved once less than ttl
			// of its life is left, and then lives 1.5 ttl, so it is still
			// listed ttl after its last check (as its bucket may be), and
			// the list stays in expiry order.
			if e.expires-at < ttl {
				e.expires = at + ttl + ttl/2
				sh.unlink(e)
				sh.pushBack(e)
			}
			return subjectOwn, false
		}
		if at >= s.fullUntil.Load() {
			// Expired, and live again: as dropped and added anew (its
			// place counted, so within the bound), but in place, without
			// a map deletion, an insertion and a new entry. The map does
			// not grow, so no expired entry need make room.
			e.expires = at + ttl + ttl/2
			sh.unlink(e)
			sh.pushBack(e)
			return subjectOwn, true
		}
		sh.drop(e)
	}
	if at < s.fullUntil.Load() {
		return subjectRefused, false
	}
	sh.dropExpired(at)
	if len(sh.m) >= s.per {
		return subjectOverflow, false
	}
	e := &liveEntry{subject: subject, expires: at + ttl + ttl/2}
	sh.m[subject] = e
	sh.pushBack(e)
	return subjectOwn, true
}

// dropExpired drops at most maxExpiredPerAdmit entries expired at at, the
// soonest to expire first.
func (sh *subjectShard) dropExpired(at int64) {
	for i := 0; i < maxExpiredPerAdmit && sh.head != nil && at >= sh.head.expires; i++ {
		sh.drop(sh.head)
	}
}

// refused records that the store refused to grow at now: new subjects are
// refused until now+cooldown, and subject, when fresh, is no longer live
// (it holds no bucket).
func (s *subjectSet) refused(subject string, fresh bool, now time.Time, cooldown time.Duration) {
	until := now.Add(cooldown).UnixNano()
	for {
		cur := s.fullUntil.Load()
		if until <= cur || s.fullUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	if !fresh {
		return
	}
	sh := s.shard(subject)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[subject]; ok {
		sh.drop(e)
	}
}

// ipSubject aggregates an IPv6 address to its prefix of bits (the
// network, as "2001:db8::/64"), so that one client cannot take a new
// subject per address of the 2^64 its network holds; an IPv4 address
// (also IPv4-mapped IPv6) stays as it is, and a value that is not an
// address is returned unchanged.
func ipSubject(v string, bits int) string {
	a, err := netip.ParseAddr(v)
	if err != nil {
		return v
	}
	a = a.Unmap()
	if !a.Is6() {
		return a.String()
	}
	pre, err := a.WithZone("").Prefix(bits)
	if err != nil {
		return v
	}
	return pre.String()
}
