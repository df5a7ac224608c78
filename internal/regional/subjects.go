package regional

import (
	"hash/maphash"
	"math"
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
//
// A subject is known by its 64-bit hash under the set's random seed (the
// hash that also picks its shard). Two subjects whose hashes collide
// (about one pair in 10^10 among 100,000 live subjects, and the seed is
// not known outside the process) share one entry: the second is taken for
// live and not counted, which leaves the bound holding, and charges
// nothing to the other's bucket, whose key is the subject itself.
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
// Entries live in a slab, linked by index in expiry order, and the table
// holds each subject's expiry and the index of its entry: neither holds
// a pointer, so the garbage collector does not scan them, and a check of
// a live subject reads one table slot (a string-keyed map also read the
// subject's bytes, and its entries were objects of their own).
type subjectShard struct {
	mu      sync.Mutex
	m       subjectTable
	entries []liveEntry
	// head expires first, tail last; free lists unused entries (via
	// next). noEntry for none.
	head, tail, free int32
}

type liveEntry struct {
	hash       uint64
	expires    int64 // unix nanoseconds
	prev, next int32
}

// noEntry is the null index of a shard's entry links (int32: a shard
// holds at most math.MaxInt32 entries, see newSubjectSet).
const noEntry = -1

// pushBack appends entry i, which is in no list, at the tail.
func (sh *subjectShard) pushBack(i int32) {
	e := &sh.entries[i]
	e.prev, e.next = sh.tail, noEntry
	if sh.tail != noEntry {
		sh.entries[sh.tail].next = i
	} else {
		sh.head = i
	}
	sh.tail = i
}

// unlink takes entry i out of the list.
func (sh *subjectShard) unlink(i int32) {
	e := &sh.entries[i]
	if e.prev != noEntry {
		sh.entries[e.prev].next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != noEntry {
		sh.entries[e.next].prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.next = noEntry, noEntry
}

// drop removes entry i from the shard.
func (sh *subjectShard) drop(i int32) {
	sh.unlink(i)
	sh.m.delete(sh.entries[i].hash)
	sh.entries[i].next = sh.free
	sh.free = i
}

// add lists a new entry for hash, expiring at expires, at the tail.
func (sh *subjectShard) add(hash uint64, expires int64) {
	i := sh.free
	if i != noEntry {
		sh.free = sh.entries[i].next
	} else {
		sh.entries = append(sh.entries, liveEntry{})
		i = int32(len(sh.entries) - 1)
	}
	sh.entries[i] = liveEntry{hash: hash, expires: expires}
	sh.m.put(hash, i, expires)
	sh.pushBack(i)
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
	s := &subjectSet{seed: maphash.MakeSeed(), shards: make([]subjectShard, n), per: min(max/n, math.MaxInt32), ttl: ttl}
	for i := range s.shards {
		s.shards[i].head, s.shards[i].tail, s.shards[i].free = noEntry, noEntry, noEntry
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

// shard returns subject's hash and shard.
func (s *subjectSet) shard(subject string) (uint64, *subjectShard) {
	h := maphash.String(s.seed, subject)
	return h, &s.shards[h%uint64(len(s.shards))]
}

// maxExpiredPerAdmit bounds the expired entries one admit drops, so that
// a check's cost stays constant; entries are dropped at least as fast as
// new ones come.
const maxExpiredPerAdmit = 4

// admit records a check of subject at now and says how it is charged;
// fresh is true when the check made the subject live (it held no bucket
// this node knew of).
func (s *subjectSet) admit(subject string, now time.Time) (v subjectVerdict, fresh bool) {
	h, sh := s.shard(subject)
	at, ttl := now.UnixNano(), int64(s.ttl)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot := sh.m.find(h); slot != nil {
		i := slot.i1 - 1
		if at < slot.expires {
			// Moving an entry to the back on every check cost a list
			// operation per check; an entry is moved once less than ttl
			// of its life is left, and then lives 1.5 ttl, so it is still
			// listed ttl after its last check (as its bucket may be), and
			// the list stays in expiry order.
			if slot.expires-at < ttl {
				sh.renew(slot, at+ttl+ttl/2)
			}
			return subjectOwn, false
		}
		if at >= s.fullUntil.Load() {
			// Expired, and live again: as dropped and added anew (its
			// place counted, so within the bound), but in place. The
			// table does not grow, so no expired entry need make room.
			sh.renew(slot, at+ttl+ttl/2)
			return subjectOwn, true
		}
		sh.drop(i)
	}
	if at < s.fullUntil.Load() {
		return subjectRefused, false
	}
	sh.dropExpired(at)
	if sh.m.len() >= s.per {
		return subjectOverflow, false
	}
	sh.add(h, at+ttl+ttl/2)
	return subjectOwn, true
}

// renew makes slot's entry expire at expires, at the tail.
func (sh *subjectShard) renew(slot *tableSlot, expires int64) {
	i := slot.i1 - 1
	slot.expires = expires
	sh.entries[i].expires = expires
	sh.unlink(i)
	sh.pushBack(i)
}

// dropExpired drops at most maxExpiredPerAdmit entries expired at at, the
// soonest to expire first.
func (sh *subjectShard) dropExpired(at int64) {
	for i := 0; i < maxExpiredPerAdmit && sh.head != noEntry && at >= sh.entries[sh.head].expires; i++ {
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
	h, sh := s.shard(subject)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot := sh.m.find(h); slot != nil {
		sh.drop(slot.i1 - 1)
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
