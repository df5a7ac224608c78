package bucket

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// DefaultMaxBuckets is the bucket cap of a Memory whose MaxBuckets is 0.
const DefaultMaxBuckets = 1 << 20

// DefaultSweepEvery is how often Run sweeps when SweepEvery is 0.
const DefaultSweepEvery = time.Minute

const memShards = 64

var (
	// ErrMemoryFull reports a store that refused to grow: a Memory holding
	// MaxBuckets live buckets when a request needed a new one (existing
	// buckets keep working), or a Redis at its maxmemory that answered a
	// script's write with an OOM reply (noeviction). Either way the store
	// answered; it did not fail.
	ErrMemoryFull = errors.New("bucket: memory store full")
	// ErrDuplicateKey reports a TakeAll that names one bucket twice.
	ErrDuplicateKey = errors.New("bucket: duplicate key in TakeAll")
	// ErrTakeAllSize reports a TakeAll with no request or more than MaxTakeAll.
	ErrTakeAllSize = errors.New("bucket: TakeAll needs 1 to MaxTakeAll requests")
)

// Clock tells a Memory the time; tests pass a manual one.
type Clock interface {
	Now() time.Time
}

// MemoryConfig configures a Memory.
type MemoryConfig struct {
	// Clock is read by Take, TakeAll, Refund and Run; nil means the
	// system's clock.
	Clock Clock
	// MaxBuckets caps the live buckets; 0 means DefaultMaxBuckets. When a
	// request must create a bucket at the cap, the store first sweeps the
	// expired buckets of the bucket's shard and (at most once a second)
	// of every other shard not locked at that moment; if it is still at the
	// cap the request fails with ErrMemoryFull (a peek or a denial never
	// needs a new bucket, and existing buckets keep working). The caller
	// applies its failure mode, as for a Redis error.
	MaxBuckets int
	// SweepEvery is Run's sweep period; 0 means DefaultSweepEvery.
	SweepEvery time.Duration
	// LossGuard makes the store treat its start as a loss of state, as a
	// Redis store with RedisConfig.LossGuard treats a missing loss
	// marker: the store keeps a marker per group (Groups, the subject's
	// group as in Redis), created by the first call that finds a bucket
	// of that group absent, and a bucket absent less than its refill time
	// (token bucket: its idle TTL; window algorithms: its window) after
	// its group's marker was created starts empty (token bucket) or full
	// (window algorithms) at that instant. It is what a process that
	// decides alone from memory needs, since its buckets are lost when it
	// restarts; without it (the default) a Memory starts as if it had
	// never held a bucket, as the in-process fallback of a regional node
	// does. With LossGuard and the same Groups, a Memory decides as a
	// Redis store with LossGuard on a server that starts empty.
	LossGuard bool
	// Groups is the group count of the loss markers (LossGuard only); 0
	// means DefaultGroups, at most MaxGroups.
	Groups int
}

// Memory is the in-memory store: the specification of Redis, the embedded
// default of a regional node and the model of the simulator. It is safe for
// concurrent use (64 shards, each with its own mutex; a subject's buckets
// share one shard). Its hot path (TakeAt of an existing bucket) does not
// allocate. It starts no goroutine; Run sweeps periodically if wanted.
//
// Each bucket is one entry (its Key, which carries its hash, and its State:
// 96 bytes) stored in a slot of its shard's open-addressing index, so that
// finding a bucket touches one place in memory: linear probing by hash,
// then an exact Key comparison, so a 64-bit hash collision only costs a
// longer probe;
// deletion shifts the following slots back, leaving no tombstones. The
// index grows at 7/8 full and shrinks in a sweep that leaves it under 1/8
// full, so memory follows the live buckets (at most MaxBuckets). Each shard
// also remembers the last Limits and share it validated, so a run of
// requests of one policy at one share is validated and converted once.
type Memory struct {
	clk   Clock
	max   int64
	every time.Duration
	live  atomic.Int64
	// lastFull is when (microseconds) reserve last swept every shard.
	lastFull atomic.Int64
	// marks holds, with LossGuard, each group's loss marker: the instant
	// (microseconds) it was created, 0 while it is not; nil without.
	marks  []atomic.Int64
	groups uint32
	shards [memShards]memShard
	// leases holds the lease sets (lease.go), at most max of them; leaseMu
	// is taken inside a shard's lock.
	leaseMu sync.Mutex
	leases  memLeases
}

type memShard struct {
	memShardBody
	_ [64 - unsafe.Sizeof(memShardBody{})%64]byte // keep shards on separate cache lines
}

type memShardBody struct {
	mu  sync.Mutex
	idx []entry // len 0 or a power of 2, at most maxLoad full
	n   int     // entries
	pc  paramCache
}

// entry is one bucket, stored in its slot of the shard's index; a zero key
// marks an empty slot.
type entry struct {
	key Key
	st  State
}

// paramCache is the last Limits, share and withheld share a shard
// validated, with their params: a request with equal ones is valid when
// its key is set and its cost lies in 0..Capacity. Under the shard's
// lock, p.cost is the current request's.
type paramCache struct {
	lim      Limits
	share    float64
	withheld float64
	p        params
	ok       bool
}

// fill validates req and, when it is valid, caches its Limits, share and
// params. It is apart from Memory.one to keep the hot path small.
//
//go:noinline
func (c *paramCache) fill(req *Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	c.lim, c.share, c.withheld, c.p, c.ok = req.Limits, req.Share, req.Withheld, paramsOf(req), true
	return nil
}

// minSlots is the smallest index; an index grows past maxLoadNum/maxLoadDen
// full.
const (
	minSlots   = 8
	maxLoadNum = 7
	maxLoadDen = 8
)

// NewMemory returns an empty Memory.
func NewMemory(cfg MemoryConfig) (*Memory, error) {
	if cfg.MaxBuckets < 0 {
		return nil, fmt.Errorf("bucket: new memory store: MaxBuckets %d is negative", cfg.MaxBuckets)
	}
	if cfg.SweepEvery < 0 {
		return nil, fmt.Errorf("bucket: new memory store: SweepEvery %v is negative", cfg.SweepEvery)
	}
	if cfg.Groups < 0 || cfg.Groups > MaxGroups {
		return nil, fmt.Errorf("bucket: new memory store: Groups %d, want 0 (default %d) to %d", cfg.Groups, DefaultGroups, MaxGroups)
	}
	m := &Memory{clk: cfg.Clock, max: int64(cfg.MaxBuckets), every: cfg.SweepEvery}
	if cfg.LossGuard {
		m.groups = uint32(cfg.Groups)
		if m.groups == 0 {
			m.groups = DefaultGroups
		}
		m.marks = make([]atomic.Int64, m.groups)
	}
	if m.clk == nil {
		m.clk = systemClock{}
	}
	if m.max == 0 {
		m.max = DefaultMaxBuckets
	}
	if m.every == 0 {
		m.every = DefaultSweepEvery
	}
	return m, nil
}

// shardOf picks the shard from the hash's top bits, which depend on the
// subject only.
func (m *Memory) shardOf(k *Key) int {
	return int(k.hash >> 58)
}

// Take implements Store at the configured clock's time.
func (m *Memory) Take(_ context.Context, req Request) (Decision, error) {
	return m.TakeAt(m.clk.Now(), req)
}

// TakeAll implements Store at the configured clock's time.
func (m *Memory) TakeAll(_ context.Context, reqs []Request) ([]Decision, error) {
	return m.TakeAllAt(m.clk.Now(), reqs)
}

// Refund implements Store at the configured clock's time.
func (m *Memory) Refund(_ context.Context, req Request) (Decision, error) {
	return m.RefundAt(m.clk.Now(), req)
}

// TakeAt charges req.Cost at now when the bucket holds it (Cost 0 peeks).
// A denial is a Decision with Allowed false, not an error; errors report an
// invalid request or ErrMemoryFull.
func (m *Memory) TakeAt(now time.Time, req Request) (Decision, error) {
	if req.sharded() {
		return m.subBuckets(now).take(&req, opTake)
	}
	return m.one(now, &req, opTake)
}

// RefundAt gives back req.Cost at now, never above the bucket's capacity.
func (m *Memory) RefundAt(now time.Time, req Request) (Decision, error) {
	if req.sharded() {
		return m.subBuckets(now).take(&req, opRefund)
	}
	return m.one(now, &req, opRefund)
}

// subBuckets is the sharded path's access to m at now (Limits.Shards).
func (m *Memory) subBuckets(now time.Time) *shardOps {
	return &shardOps{
		one: func(req *Request, op byte) (Decision, error) { return m.one(now, req, op) },
		all: func(reqs []Request) ([]Decision, error) { return m.TakeAllAt(now, reqs) },
	}
}

func (m *Memory) one(now time.Time, req *Request, op byte) (Decision, error) {
	if req.Key.IsZero() {
		return Decision{}, req.Validate()
	}
	us := now.UnixMicro()
	sh := &m.shards[m.shardOf(&req.Key)]
	sh.mu.Lock()
	c := &sh.pc
	if !c.ok || req.Share != c.share || req.Withheld != c.withheld || req.Limits != c.lim || req.Cost < 0 || req.Cost > req.Limits.Capacity {
		if err := c.fill(req); err != nil {
			sh.mu.Unlock()
			return Decision{}, err
		}
	}
	p := &c.p // the shard's: its cost and since are this request's until the unlock
	p.cost = req.costUnits()
	p.since, p.born = 0, 0
	if !req.Since.IsZero() {
		since := req.Since.UnixMicro()
		if since <= 0 || since >= maxInstant {
			sh.mu.Unlock()
			return Decision{}, req.Validate()
		}
		p.since = float64(since)
	}
	var o outcome
	// One lookup serves the read and, for an existing bucket, the write,
	// both on the stored State in place.
	if e := sh.find(&req.Key); e != nil {
		if e.st.absent(p, us) {
			p.born = m.born(&req.Key, us, p.since)
		}
		lw := e.st.into(p, op, us, true, &o)
		switch o.w {
		case writeSet:
			e.st.commit(p, &o, lw, us)
		case writeDel:
			sh.remove(&req.Key)
			m.live.Add(-1)
		}
	} else {
		var st State
		p.born = m.born(&req.Key, us, p.since)
		lw := st.into(p, op, us, true, &o)
		if o.w == writeSet {
			if err := m.reserve(sh, us); err != nil {
				sh.mu.Unlock()
				return Decision{}, err
			}
			sh.insert(&req.Key).st.commit(p, &o, lw, us)
		}
	}
	lim := p.lim
	sh.mu.Unlock()
	return decision(o.ok, lim, o.rem, o.retry, o.reset, us), nil
}

// born returns the instant at which a bucket of k found absent at us may
// have been lost (params.born): the later of since and, with LossGuard, the
// marker of k's group, which this call creates at us when the group has
// none yet. 0: the bucket is simply new.
func (m *Memory) born(k *Key, us int64, since float64) float64 {
	if m.marks == nil {
		return since
	}
	mk := &m.marks[groupOf(k.subject, m.groups)]
	c := mk.Load()
	if c == 0 {
		if mk.CompareAndSwap(0, us) {
			c = us
		} else {
			c = mk.Load()
		}
	}
	return max(since, float64(c))
}

// find returns k's entry in sh, or nil. The entry lives in the index: the
// pointer is good until the next insert, delete or sweep of the shard.
func (sh *memShard) find(k *Key) *entry {
	mask := len(sh.idx) - 1
	if mask < 0 {
		return nil
	}
	for i := int(k.hash) & mask; ; i = (i + 1) & mask {
		s := &sh.idx[i]
		if s.key.IsZero() {
			return nil
		}
		if s.key.hash == k.hash && s.key == *k {
			return s
		}
	}
}

// insert adds an entry for k, absent from sh (growing the index first when
// it would pass maxLoad), and returns it (good until the shard next changes,
// as find's).
func (sh *memShard) insert(k *Key) *entry {
	if (sh.n+1)*maxLoadDen > len(sh.idx)*maxLoadNum {
		sh.reindex(max(minSlots, 2*len(sh.idx)))
	}
	sh.n++
	return sh.link(&entry{key: *k})
}

// link copies e into the first empty slot of its probe sequence and returns
// the slot.
func (sh *memShard) link(e *entry) *entry {
	mask := len(sh.idx) - 1
	i := int(e.key.hash) & mask
	for !sh.idx[i].key.IsZero() {
		i = (i + 1) & mask
	}
	sh.idx[i] = *e
	return &sh.idx[i]
}

// reindex moves every entry to a new index of size slots (a power of 2
// that keeps the load at most maxLoad).
func (sh *memShard) reindex(size int) {
	old := sh.idx
	sh.idx = make([]entry, size)
	for i := range old {
		if !old[i].key.IsZero() {
			sh.link(&old[i])
		}
	}
}

// del empties index slot i and shifts back the slots after it that probing
// would otherwise no longer reach.
func (sh *memShard) del(i int) {
	mask := len(sh.idx) - 1
	for j := (i + 1) & mask; !sh.idx[j].key.IsZero(); j = (j + 1) & mask {
		home := int(sh.idx[j].key.hash) & mask
		// j may move to i when i lies on its probe path, in [home, j].
		if (i-home)&mask <= (j-home)&mask {
			sh.idx[i] = sh.idx[j]
			i = j
		}
	}
	sh.idx[i] = entry{}
	sh.n--
}

// remove deletes k's entry from sh and reports whether there was one.
func (sh *memShard) remove(k *Key) bool {
	mask := len(sh.idx) - 1
	if mask < 0 {
		return false
	}
	for i := int(k.hash) & mask; !sh.idx[i].key.IsZero(); i = (i + 1) & mask {
		if s := &sh.idx[i]; s.key.hash == k.hash && s.key == *k {
			sh.del(i)
			return true
		}
	}
	return false
}

// reserve counts one new bucket. At the cap it sweeps the caller's shard
// (locked by the caller), then, at most once per second of store time, every
// other shard whose lock is free; if the store is still full it fails.
func (m *Memory) reserve(sh *memShard, us int64) error {
	if m.tryCount() {
		return nil
	}
	m.sweepShard(sh, us)
	if m.live.Load() >= m.max {
		if last := m.lastFull.Load(); us-last >= 1_000_000 && m.lastFull.CompareAndSwap(last, us) {
			for i := range m.shards {
				o := &m.shards[i]
				if o != sh && o.mu.TryLock() {
					m.sweepShard(o, us)
					o.mu.Unlock()
				}
			}
		}
	}
	if m.tryCount() {
		return nil
	}
	return fmt.Errorf("%w: %d buckets", ErrMemoryFull, m.max)
}

// tryCount counts one more bucket unless the store holds MaxBuckets, so
// that Len never passes the cap, not even for a moment.
func (m *Memory) tryCount() bool {
	for {
		n := m.live.Load()
		if n >= m.max {
			return false
		}
		if m.live.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// TakeAllAt checks several buckets atomically at now: either every request
// is admitted and charged, or none is charged and every decision reports
// Allowed false (the ones that blocked carry a RetryAfter). Requests may
// name buckets of different subjects; they must not name one bucket twice.
// Room for every bucket the call creates is reserved before any is
// charged, so an error (ErrMemoryFull included) changes no bucket.
func (m *Memory) TakeAllAt(now time.Time, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 || len(reqs) > MaxTakeAll {
		return nil, fmt.Errorf("%w: got %d", ErrTakeAllSize, len(reqs))
	}
	for i := range reqs {
		if reqs[i].sharded() {
			return m.subBuckets(now).takeAll(reqs)
		}
	}
	var ps [MaxTakeAll]params
	var shardIdx [MaxTakeAll]int
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == reqs[i].Key {
				return nil, fmt.Errorf("%w: %s", ErrDuplicateKey, reqs[i].Key)
			}
		}
		ps[i] = paramsOf(&reqs[i])
		shardIdx[i] = m.shardOf(&reqs[i].Key)
	}
	locks := append([]int(nil), shardIdx[:len(reqs)]...)
	sort.Ints(locks)
	for i, s := range locks {
		if i == 0 || s != locks[i-1] {
			m.shards[s].mu.Lock()
			defer m.shards[s].mu.Unlock()
		}
	}
	us := now.UnixMicro()
	var sts [MaxTakeAll]State
	charge := true
	for i := range reqs {
		sh := &m.shards[shardIdx[i]]
		if e := sh.find(&reqs[i].Key); e != nil {
			sts[i] = e.st
		}
		if sts[i].absent(&ps[i], us) {
			ps[i].born = m.born(&reqs[i].Key, us, ps[i].since)
		}
	}
	if len(reqs) > 1 {
		for i := range reqs {
			if o, _ := sts[i].step(&ps[i], opTake, us, false); !o.ok {
				charge = false
				break
			}
		}
	}
	var outs [MaxTakeAll]outcome
	var lws [MaxTakeAll]int64
	var fresh [MaxTakeAll]bool // the write may need a new entry: room reserved
	reserved := int64(0)
	for i := range reqs {
		outs[i], lws[i] = sts[i].step(&ps[i], opTake, us, charge)
		if outs[i].w != writeSet {
			continue
		}
		// Reserve room for every bucket the writes may create before
		// writing any, so that ErrMemoryFull leaves every bucket as it was.
		// An expired entry counts as new: reserve may sweep it away.
		if sts[i].live(us) {
			continue
		}
		if err := m.reserve(&m.shards[shardIdx[i]], us); err != nil {
			m.live.Add(-reserved)
			return nil, fmt.Errorf("take all, request %d: %w", i, err)
		}
		fresh[i] = true
		reserved++
	}
	out := make([]Decision, len(reqs))
	for i := range reqs {
		m.write(&m.shards[shardIdx[i]], &reqs[i].Key, &ps[i], &outs[i], lws[i], us, fresh[i])
		out[i] = decision(outs[i].ok && charge, ps[i].lim, outs[i].rem, outs[i].retry, outs[i].reset, us)
	}
	return out, nil
}

// write stores o for k, with the room for a new entry already counted when
// reserved (and given back when the entry turns out to exist).
func (m *Memory) write(sh *memShard, k *Key, p *params, o *outcome, lastWrite, us int64, reserved bool) {
	switch o.w {
	case writeSet:
		if e := sh.find(k); e != nil {
			e.st.commit(p, o, lastWrite, us)
			if reserved {
				m.live.Add(-1)
			}
			return
		}
		if !reserved {
			// TakeAllAt reserved for every entry absent or expired; a live
			// one cannot have gone (sweeps drop expired entries only), so
			// this only keeps the count right.
			m.live.Add(1)
		}
		sh.insert(k).st.commit(p, o, lastWrite, us)
	case writeDel:
		if sh.remove(k) {
			m.live.Add(-1)
		}
	}
}

// Sweep drops every bucket expired at now (idle for its TTL since its last
// write) and returns how many it dropped.
func (m *Memory) Sweep(now time.Time) int {
	us := now.UnixMicro()
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += m.sweepShard(sh, us)
		sh.mu.Unlock()
	}
	return n
}

func (m *Memory) sweepShard(sh *memShard, us int64) int {
	n := 0
	for i := 0; i < len(sh.idx); {
		if e := &sh.idx[i]; !e.key.IsZero() && !e.st.live(us) {
			// del may shift a later slot into i (or, wrapping round, one
			// already seen): look at i again.
			sh.del(i)
			n++
			continue
		}
		i++
	}
	// Give memory back once the index is less than 1/8 full.
	if size := len(sh.idx); size > minSlots && 8*sh.n < size {
		if sh.n == 0 {
			sh.idx = nil
		} else {
			for size > minSlots && 4*sh.n < size {
				size /= 2
			}
			sh.reindex(size)
		}
	}
	m.live.Add(int64(-n))
	return n
}

// Len returns the number of buckets held, expired or not until swept.
func (m *Memory) Len() int { return int(m.live.Load()) }

// Run sweeps expired buckets every SweepEvery at the configured clock's
// time until ctx is done, then returns ctx.Err(). It runs in the caller's
// goroutine.
func (m *Memory) Run(ctx context.Context) error {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			m.Sweep(m.clk.Now())
		}
	}
}

// systemClock is the system's clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
