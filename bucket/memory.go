package bucket

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotacoord/quota/internal/clock"
)

// DefaultMaxBuckets is the bucket cap of a Memory whose MaxBuckets is 0.
const DefaultMaxBuckets = 1 << 20

// DefaultSweepEvery is how often Run sweeps when SweepEvery is 0.
const DefaultSweepEvery = time.Minute

const memShards = 64

var (
	// ErrMemoryFull reports that a Memory holds MaxBuckets live buckets and
	// a request needed a new one. Existing buckets keep working.
	ErrMemoryFull = errors.New("bucket: memory store full")
	// ErrDuplicateKey reports a TakeAll that names one bucket twice.
	ErrDuplicateKey = errors.New("bucket: duplicate key in TakeAll")
	// ErrTakeAllSize reports a TakeAll with no request or more than MaxTakeAll.
	ErrTakeAllSize = errors.New("bucket: TakeAll needs 1 to MaxTakeAll requests")
)

// MemoryConfig configures a Memory.
type MemoryConfig struct {
	// Clock is read by Take, TakeAll, Refund and Run; nil means clock.Real{}.
	Clock clock.Clock
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
}

// Memory is the in-memory store: the specification of Redis, the embedded
// default of a regional node and the model of the simulator. It is safe for
// concurrent use (64 shards, each with its own mutex; a subject's buckets
// share one shard). Its hot path (TakeAt of an existing bucket) does not
// allocate. It starts no goroutine; Run sweeps periodically if wanted.
type Memory struct {
	clk   clock.Clock
	max   int64
	every time.Duration
	live  atomic.Int64
	// lastFull is when (microseconds) reserve last swept every shard.
	lastFull atomic.Int64
	shards   [memShards]memShard
}

type memShard struct {
	mu sync.Mutex
	m  map[uint64]*entry // by Key.hash; a chain for 64-bit collisions
	_  [48]byte          // keep shards on separate cache lines
}

type entry struct {
	key  Key
	st   State
	next *entry
}

// NewMemory returns an empty Memory.
func NewMemory(cfg MemoryConfig) (*Memory, error) {
	if cfg.MaxBuckets < 0 {
		return nil, fmt.Errorf("bucket: new memory store: MaxBuckets %d is negative", cfg.MaxBuckets)
	}
	if cfg.SweepEvery < 0 {
		return nil, fmt.Errorf("bucket: new memory store: SweepEvery %v is negative", cfg.SweepEvery)
	}
	m := &Memory{clk: cfg.Clock, max: int64(cfg.MaxBuckets), every: cfg.SweepEvery}
	if m.clk == nil {
		m.clk = clock.Real{}
	}
	if m.max == 0 {
		m.max = DefaultMaxBuckets
	}
	if m.every == 0 {
		m.every = DefaultSweepEvery
	}
	for i := range m.shards {
		m.shards[i].m = make(map[uint64]*entry)
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
	return m.one(now, req, opTake)
}

// RefundAt gives back req.Cost at now, never above the bucket's capacity.
func (m *Memory) RefundAt(now time.Time, req Request) (Decision, error) {
	return m.one(now, req, opRefund)
}

func (m *Memory) one(now time.Time, req Request, op byte) (Decision, error) {
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	p := paramsOf(&req)
	us := now.UnixMicro()
	sh := &m.shards[m.shardOf(&req.Key)]
	sh.mu.Lock()
	// One lookup serves the read and, for an existing bucket, the write.
	e := sh.find(&req.Key)
	var st State
	if e != nil {
		st = e.st
	}
	o, lw := st.step(&p, op, us, true)
	if e != nil && o.w == writeSet {
		e.st.commit(&p, &o, lw, us)
	} else if err := m.apply(sh, &req.Key, &p, &o, lw, us); err != nil {
		sh.mu.Unlock()
		return Decision{}, err
	}
	sh.mu.Unlock()
	return decision(o.ok, p.lim, o.rem, o.retry, o.reset), nil
}

// find returns k's entry in sh, or nil.
func (sh *memShard) find(k *Key) *entry {
	e := sh.m[k.hash]
	for e != nil && e.key != *k {
		e = e.next
	}
	return e
}

// load returns a copy of the bucket's State (the zero State when absent;
// State.step treats an expired one as absent, as Redis would have dropped
// its key).
func (m *Memory) load(sh *memShard, k *Key) State {
	if e := sh.find(k); e != nil {
		return e.st
	}
	return State{}
}

func (m *Memory) apply(sh *memShard, k *Key, p *params, o *outcome, lastWrite, us int64) error {
	switch o.w {
	case writeSet:
		if e := sh.find(k); e != nil {
			e.st.commit(p, o, lastWrite, us)
			return nil
		}
		if err := m.reserve(sh, us); err != nil {
			return err
		}
		e := &entry{key: *k, next: sh.m[k.hash]}
		e.st.commit(p, o, lastWrite, us)
		sh.m[k.hash] = e
	case writeDel:
		if sh.unlink(k.hash, func(e *entry) bool { return e.key == *k }) > 0 {
			m.live.Add(-1)
		}
	}
	return nil
}

// unlink removes the entries under hash h for which drop is true and
// returns how many it removed.
func (sh *memShard) unlink(h uint64, drop func(*entry) bool) int {
	n := 0
	var head, tail *entry
	for e := sh.m[h]; e != nil; {
		next := e.next
		if drop(e) {
			n++
		} else {
			e.next = nil
			if tail == nil {
				head = e
			} else {
				tail.next = e
			}
			tail = e
		}
		e = next
	}
	if head == nil {
		delete(sh.m, h)
	} else {
		sh.m[h] = head
	}
	return n
}

// reserve counts one new bucket. At the cap it sweeps the caller's shard
// (locked by the caller), then, at most once per second of store time, every
// other shard whose lock is free; if the store is still full it fails.
func (m *Memory) reserve(sh *memShard, us int64) error {
	if m.live.Add(1) <= m.max {
		return nil
	}
	m.live.Add(-1)
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
	if m.live.Add(1) <= m.max {
		return nil
	}
	m.live.Add(-1)
	return fmt.Errorf("%w: %d buckets", ErrMemoryFull, m.max)
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
		sts[i] = m.load(&m.shards[shardIdx[i]], &reqs[i].Key)
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
		sh := &m.shards[shardIdx[i]]
		if e := sh.find(&reqs[i].Key); e != nil && e.st.live(us) {
			continue
		}
		if err := m.reserve(sh, us); err != nil {
			m.live.Add(-reserved)
			return nil, fmt.Errorf("take all, request %d: %w", i, err)
		}
		fresh[i] = true
		reserved++
	}
	out := make([]Decision, len(reqs))
	for i := range reqs {
		m.write(&m.shards[shardIdx[i]], &reqs[i].Key, &ps[i], &outs[i], lws[i], us, fresh[i])
		out[i] = decision(outs[i].ok && charge, ps[i].lim, outs[i].rem, outs[i].retry, outs[i].reset)
	}
	return out, nil
}

// write stores o for k as apply does, with the room for a new entry already
// counted when reserved (and given back when the entry turns out to exist).
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
		e := &entry{key: *k, next: sh.m[k.hash]}
		e.st.commit(p, o, lastWrite, us)
		sh.m[k.hash] = e
	case writeDel:
		if sh.unlink(k.hash, func(e *entry) bool { return e.key == *k }) > 0 {
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
	expired := func(e *entry) bool { return !e.st.live(us) }
	for h, e := range sh.m {
		for ; e != nil; e = e.next {
			if expired(e) {
				n += sh.unlink(h, expired)
				break
			}
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
