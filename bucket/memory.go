package bucket

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
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
	// expired buckets of the bucket's shard; if it is still at the cap the
	// request fails with ErrMemoryFull (a peek or a denial never needs a new
	// bucket). The caller applies its failure mode, as for a Redis error.
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
	clk    clock.Clock
	max    int64
	every  time.Duration
	seed   maphash.Seed
	live   atomic.Int64
	shards [memShards]memShard
}

type memShard struct {
	mu sync.Mutex
	m  map[Key]state
	_  [40]byte // keep shards on separate cache lines
}

// NewMemory returns an empty Memory.
func NewMemory(cfg MemoryConfig) (*Memory, error) {
	if cfg.MaxBuckets < 0 {
		return nil, fmt.Errorf("bucket: new memory store: MaxBuckets %d is negative", cfg.MaxBuckets)
	}
	if cfg.SweepEvery < 0 {
		return nil, fmt.Errorf("bucket: new memory store: SweepEvery %v is negative", cfg.SweepEvery)
	}
	m := &Memory{clk: cfg.Clock, max: int64(cfg.MaxBuckets), every: cfg.SweepEvery, seed: maphash.MakeSeed()}
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
		m.shards[i].m = make(map[Key]state)
	}
	return m, nil
}

func (m *Memory) shardOf(k *Key) int {
	return int(maphash.String(m.seed, k.subject) % memShards)
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
	defer sh.mu.Unlock()
	st, ok := m.load(sh, &req.Key, us)
	o := decide(&p, op, &st, ok, float64(us), true)
	if err := m.apply(sh, &req.Key, &p, &o, ok, st.lastWrite, us); err != nil {
		return Decision{}, err
	}
	return decision(o.ok, p.lim, o.rem, o.retry, o.reset), nil
}

// load returns the bucket's state, treating an expired bucket as absent
// (Redis would have dropped its key).
func (m *Memory) load(sh *memShard, k *Key, us int64) (state, bool) {
	st, ok := sh.m[*k]
	if ok && us-st.lastWrite >= st.ttl {
		return state{}, false
	}
	return st, ok
}

func (m *Memory) apply(sh *memShard, k *Key, p *params, o *outcome, existed bool, lastWrite, us int64) error {
	switch o.w {
	case writeSet:
		if _, present := sh.m[*k]; !present {
			if err := m.reserve(sh, us); err != nil {
				return err
			}
		}
		o.next.ttl = p.ttl * 1000
		o.next.lastWrite = max(lastWrite, us)
		sh.m[*k] = o.next
	case writeDel:
		if _, present := sh.m[*k]; present {
			delete(sh.m, *k)
			m.live.Add(-1)
		}
	}
	return nil
}

// reserve counts one new bucket, sweeping the shard (locked by the caller)
// once if the store is at its cap.
func (m *Memory) reserve(sh *memShard, us int64) error {
	if m.live.Add(1) <= m.max {
		return nil
	}
	m.live.Add(-1)
	m.sweepShard(sh, us)
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
	var sts [MaxTakeAll]state
	var exists [MaxTakeAll]bool
	charge := true
	for i := range reqs {
		sts[i], exists[i] = m.load(&m.shards[shardIdx[i]], &reqs[i].Key, us)
	}
	if len(reqs) > 1 {
		for i := range reqs {
			if !decide(&ps[i], opTake, &sts[i], exists[i], float64(us), false).ok {
				charge = false
				break
			}
		}
	}
	out := make([]Decision, len(reqs))
	for i := range reqs {
		o := decide(&ps[i], opTake, &sts[i], exists[i], float64(us), charge)
		if err := m.apply(&m.shards[shardIdx[i]], &reqs[i].Key, &ps[i], &o, exists[i], sts[i].lastWrite, us); err != nil {
			return nil, err
		}
		out[i] = decision(o.ok && charge, ps[i].lim, o.rem, o.retry, o.reset)
	}
	return out, nil
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
	for k, st := range sh.m {
		if us-st.lastWrite >= st.ttl {
			delete(sh.m, k)
			n++
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
