package bucket_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// TestShardPartsAddUp: the sub-buckets' capacities and fills add up to
// the whole bucket's exactly, all but sub-bucket 0 hold whole tokens, a
// fill never exceeds its capacity, and the sub-rates add up to the whole
// rate, never more, each in proportion to its capacity.
func TestShardPartsAddUp(t *testing.T) {
	k, _ := bucket.NewKey("p", 1, "s")
	rapid.Check(t, func(rt *rapid.T) {
		c := rapid.Int64Range(1, 1_000_000).Draw(rt, "capacity")
		shards := rapid.IntRange(2, bucket.MaxShards).Draw(rt, "shards")
		share := rapid.Float64Range(1e-6, 2).Draw(rt, "share")
		withheld := share * rapid.Float64Range(0, 1).Draw(rt, "withheld")
		req := bucket.Request{Key: k, Share: share, Withheld: withheld, Limits: bucket.Limits{
			Capacity: c, RefillPerSecond: float64(c) / 10, IdleTTL: time.Hour, Overcommit: 1, Shards: shards}}
		if err := req.Validate(); err != nil {
			rt.Fatalf("drawn request invalid: %v", err)
		}
		lim, fill, rate := bucket.ShardParams(req, -1)
		var sumLim, sumFill, sumRate float64
		for i := range shards {
			l, f, r := bucket.ShardParams(req, i)
			if i > 0 && math.Mod(l, 1000) != 0 {
				rt.Fatalf("sub-bucket %d holds %v milli-tokens, not whole tokens", i, l)
			}
			if f > l {
				rt.Fatalf("sub-bucket %d: fill %v above capacity %v", i, f, l)
			}
			if l > 0 && math.Abs(r/l-rate/lim) > 1e-12*rate/lim {
				rt.Fatalf("sub-bucket %d refills in %v µs, whole bucket in %v", i, l/r, lim/rate)
			}
			sumLim, sumFill, sumRate = sumLim+l, sumFill+f, sumRate+r
		}
		if sumLim != lim {
			rt.Fatalf("capacities add up to %v, whole %v", sumLim, lim)
		}
		if sumFill > fill || (withheld == 0 && sumFill != fill) {
			rt.Fatalf("fills add up to %v, whole %v", sumFill, fill)
		}
		// A bucket below a milli-token holds nothing, whatever its refill.
		if lim > 0 && (sumRate > rate || sumRate < rate*(1-1e-12)) {
			rt.Fatalf("rates add up to %v, whole %v", sumRate, rate)
		}
		if n := bucket.ActiveShards(lim, shards); n < shards {
			for i := n; i < shards; i++ {
				if l, _, _ := bucket.ShardParams(req, i); l != 0 {
					rt.Fatalf("sub-bucket %d of %d active holds %v", i, n, l)
				}
			}
		}
	})
}

// racers runs n goroutines that each take random costs of 1..maxCost
// through take until their first denial, then drains what is left with
// cost 1 from one goroutine, and returns the tokens admitted in all.
func racers(t *testing.T, n int, maxCost int64, req bucket.Request, take func(bucket.Request) (bucket.Decision, error)) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n+1)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				r := req
				r.Cost = 1 + rand.Int64N(maxCost)
				d, err := take(r)
				if err != nil {
					errs <- err
					return
				}
				if !d.Allowed {
					return
				}
				admitted.Add(r.Cost)
			}
		}()
	}
	close(start)
	wg.Wait()
	for r := req; ; {
		r.Cost = 1
		d, err := take(r)
		if err != nil {
			errs <- err
			break
		}
		if !d.Allowed {
			if d.Remaining >= 1 {
				t.Errorf("denied cost 1 with %v remaining", d.Remaining)
			}
			break
		}
		admitted.Add(1)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}

// TestShardedExactRacers: N racers on one sharded bucket without refill
// (a share that leaves a fraction of a token and an uneven split) admit
// exactly the region's whole tokens, floor(f·C), as one bucket would: on
// Memory, on one Redis server with several stores, and on a three-master
// Redis Cluster whose masters each hold two of the six sub-buckets.
func TestShardedExactRacers(t *testing.T) {
	const n, capacity, share = 48, 1000, 0.3337 // 333.7 tokens: 333 whole
	want := int64(math.Floor(share * capacity))
	lim := bucket.Limits{Capacity: capacity, IdleTTL: time.Hour, Shards: 6}
	newReq := func(t *testing.T) bucket.Request {
		k, err := bucket.NewKey("global", 1, redistest.Unique(t))
		if err != nil {
			t.Fatal(err)
		}
		return bucket.Request{Key: k, Limits: lim, Share: share}
	}
	ctx := context.Background()
	t.Run("memory", func(t *testing.T) {
		m, err := bucket.NewMemory(bucket.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if got := racers(t, n, 5, newReq(t), func(r bucket.Request) (bucket.Decision, error) { return m.TakeAt(t0, r) }); got != want {
			t.Fatalf("admitted %d tokens, want exactly %d", got, want)
		}
	})
	t.Run("redis", func(t *testing.T) {
		addr := redistest.Addr(t)
		stores := make([]*bucket.Redis, 4)
		for i := range stores {
			c := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { _ = c.Close() })
			stores[i] = newRedis(t, c)
		}
		var next atomic.Int64
		got := racers(t, n, 5, newReq(t), func(r bucket.Request) (bucket.Decision, error) {
			return stores[next.Add(1)%int64(len(stores))].Take(ctx, r)
		})
		if got != want {
			t.Fatalf("admitted %d tokens, want exactly %d", got, want)
		}
	})
	t.Run("redis cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
		t.Cleanup(func() { _ = c.Close() })
		r := newRedis(t, c)
		req := newReq(t)
		masters := map[string]int{}
		for i := range lim.Shards {
			key, _ := bucket.ShardLocation(r, req.Key, lim, i)
			slot, err := c.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			m, err := c.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			masters[m.Options().Addr]++
			if want := int64(i * 16384 / lim.Shards); slot < want {
				t.Errorf("sub-bucket %d in slot %d, below its range starting at %d", i, slot, want)
			}
		}
		if len(masters) != 3 {
			t.Errorf("sub-buckets on masters %v, want two on each of three", masters)
		}
		for m, k := range masters {
			if k != 2 {
				t.Errorf("master %s holds %d sub-buckets, want 2", m, k)
			}
		}
		if got := racers(t, n, 5, req, func(q bucket.Request) (bucket.Decision, error) { return r.Take(ctx, q) }); got != want {
			t.Fatalf("admitted %d tokens, want exactly %d", got, want)
		}
	})
}

// TestShardedFollowsShareChanges: the growth and shrink rules of one
// bucket apply to every sub-bucket, so a sharded bucket drained after each
// share change and time step admits what one bucket of the same limits
// admits (up to the fraction of a token each sub-bucket may keep): a
// shrink clamps at once, a growth adds nothing at once, and refill follows
// the share in force.
func TestShardedFollowsShareChanges(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lim := bucket.Limits{Capacity: 100, RefillPerSecond: 10, IdleTTL: time.Minute, Overcommit: 0.5}
	sl := lim
	sl.Shards = 4
	plain, _ := bucket.NewKey("plain", 1, "s")
	split, _ := bucket.NewKey("split", 1, "s")
	drain := func(now time.Time, k bucket.Key, l bucket.Limits, share float64) (n int64) {
		for {
			d, err := m.TakeAt(now, bucket.Request{Key: k, Limits: l, Share: share, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				return n
			}
			n++
		}
	}
	for i, st := range []struct {
		at    time.Duration
		share float64
		want  int64
	}{
		// Steps fall a millisecond past whole tokens: the sub-rates add up
		// to a hair less than the whole rate (never more), so a sub-bucket
		// may reach a token a microsecond after one bucket would.
		{0, 1, 100},                       // new: full
		{0, 0.3, 0},                       // shrink: nothing added
		{1001 * ms, 0.3, 3},               // refill at 0.3·10 per second
		{1001 * ms, 1.5, 0},               // growth: nothing at once
		{2002 * ms, 1.5, 15},              // refill at the new share
		{3003 * ms, 0.2, 2},               // shrink: refill at the new share
		{3003 * ms, 1, 0},                 // growth again
		{time.Minute, 1, 100},             // full after the idle TTL
		{time.Minute, 0.37, 0},            // shrink, already drained
		{time.Minute + 5001*ms, 0.37, 18}, // 18.5 tokens: one bucket admits 18
	} {
		now := t0.Add(st.at)
		want := drain(now, plain, lim, st.share)
		got := drain(now, split, sl, st.share)
		if want != st.want {
			t.Fatalf("step %d: one bucket admitted %d, want %d", i, want, st.want)
		}
		if got != want {
			t.Fatalf("step %d (share %v at %v): sharded admitted %d, one bucket %d", i, st.share, st.at, got, want)
		}
	}
	// After a shrink from full, the sub-buckets hold exactly the new f·C.
	k2, _ := bucket.NewKey("split", 1, "t")
	if got := drain(t0, k2, sl, 1); got != 100 {
		t.Fatalf("full at share 1: admitted %d", got)
	}
	if got := drain(t0.Add(30*time.Second), k2, sl, 1.5); got != 100 {
		t.Fatalf("refilled at share 1 then grown to 1.5: admitted %d, want 100 (growth adds nothing at once)", got)
	}
}

// TestShardedLargeCost: a cost no sub-bucket holds alone is taken from
// several at once; one above what they hold together is denied with the
// time the refill needs, and one above the whole capacity at this share
// with a full refill, as one bucket answers.
func TestShardedLargeCost(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := bucket.NewKey("global", 1, "api")
	lim := bucket.Limits{Capacity: 100, RefillPerSecond: 10, IdleTTL: time.Minute, Shards: 4}
	take := func(at time.Duration, share float64, cost int64) bucket.Decision {
		t.Helper()
		d, err := m.TakeAt(t0.Add(at), bucket.Request{Key: k, Limits: lim, Share: share, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := take(0, 1, 60); !d.Allowed || d.Limit != 100 {
		t.Fatalf("cost 60 of 4×25: %+v, want admitted from several sub-buckets", d)
	}
	if d := take(0, 1, 41); d.Allowed || d.Remaining != 40 || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("cost 41 with 40 left: %+v, want denied, 40 remaining, retry after 100ms", d)
	}
	if d := take(0, 1, 40); !d.Allowed {
		t.Fatalf("cost 40 with 40 left: %+v, want admitted", d)
	}
	// Each sub-bucket refills 2.5 tokens a second (a little less: the
	// sub-rates are rounded down so that they never add up to more).
	if d := take(time.Second, 1, 30); d.Allowed || math.Abs(d.Remaining-10) > 0.01 || d.RetryAfter < 2*time.Second || d.RetryAfter > 2*time.Second+time.Millisecond {
		t.Fatalf("cost 30 with 10 left: %+v, want denied, retry after 2s", d)
	}
	if d := take(3*time.Second, 0.5, 51); d.Allowed || d.Limit != 50 || d.RetryAfter < 10*time.Second || d.RetryAfter > 10*time.Second+time.Millisecond {
		t.Fatalf("cost 51 at share 0.5: %+v, want denied, limit 50, retry after a full refill (10s)", d)
	}
	// TakeAll splits a cost over its sub-buckets as the capacity is.
	other, _ := bucket.NewKey("tenant", 1, "api")
	ds, err := m.TakeAllAt(t0.Add(time.Hour), []bucket.Request{
		{Key: other, Limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}, Share: 1, Cost: 1},
		{Key: k, Limits: lim, Share: 1, Cost: 90},
	})
	if err != nil || !ds[0].Allowed || !ds[1].Allowed || ds[1].Remaining != 10 {
		t.Fatalf("TakeAll with cost 90 of 4×25: %+v, %v; want both admitted, 10 remaining", ds, err)
	}
	ds, err = m.TakeAllAt(t0.Add(time.Hour), []bucket.Request{
		{Key: other, Limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}, Share: 1, Cost: 1},
		{Key: k, Limits: lim, Share: 1, Cost: 3},
	})
	if err != nil || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("TakeAll with cost 3 and 2.5 left in each sub-bucket after the split: %+v, %v; want admitted", ds, err)
	}
}

// TestShardedTakeAllFallsBack: a TakeAll whose sharded request meets an
// empty sub-bucket tries the others, and refunds go back.
func TestShardedTakeAllFallsBack(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := bucket.NewKey("global", 1, "api")
	other, _ := bucket.NewKey("tenant", 1, "api")
	lim := bucket.Limits{Capacity: 8, IdleTTL: time.Minute, Shards: 4}
	olim := bucket.Limits{Capacity: 100, IdleTTL: time.Minute}
	admitted := 0
	for range 20 {
		ds, err := m.TakeAllAt(t0, []bucket.Request{{Key: other, Limits: olim, Share: 1, Cost: 1}, {Key: k, Limits: lim, Share: 1, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Allowed != ds[1].Allowed {
			t.Fatalf("not all or nothing: %+v", ds)
		}
		if ds[1].Allowed {
			admitted++
		} else if ds[1].RetryAfter == 0 {
			t.Fatalf("denial of the sharded request without RetryAfter: %+v", ds)
		}
	}
	if admitted != 8 {
		t.Fatalf("admitted %d, want exactly the 8 tokens", admitted)
	}
	d, err := m.RefundAt(t0, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 6})
	if err != nil || d.Remaining != 6 {
		t.Fatalf("refund of 6: %+v, %v; want 6 remaining", d, err)
	}
	d, err = m.TakeAt(t0, bucket.Request{Key: k, Limits: lim, Share: 1})
	if err != nil || d.Remaining != 6 || d.Limit != 8 {
		t.Fatalf("peek: %+v, %v; want 6 of 8 remaining", d, err)
	}
}

// TestShardedRetryAfterMeetsSplit: a denial's RetryAfter is when the
// sub-buckets together hold the cost (a split take admits it then), not
// the later instant one sub-bucket alone would, so a cache that waits
// RetryAfter never denies what the store admits.
func TestShardedRetryAfterMeetsSplit(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := bucket.NewKey("global", 1, "api")
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 8, RefillPerSecond: 4, IdleTTL: time.Minute, Shards: 4}, Share: 1, Cost: 8}
	if d, err := m.TakeAt(t0, req); err != nil || !d.Allowed {
		t.Fatalf("drain: %+v, %v", d, err)
	}
	req.Cost = 2
	d, err := m.TakeAt(t0.Add(251*ms), req) // a quarter token in each
	if err != nil || d.Allowed {
		t.Fatalf("cost 2 with 1 token spread over 4: %+v, %v; want denied", d, err)
	}
	if d.RetryAfter > 250*ms {
		t.Fatalf("RetryAfter %v, want at most 250ms (the sum holds 2 then)", d.RetryAfter)
	}
	if d, err := m.TakeAt(t0.Add(251*ms+d.RetryAfter+ms), req); err != nil || !d.Allowed {
		t.Fatalf("cost 2 after RetryAfter: %+v, %v; want admitted from several sub-buckets", d, err)
	}
}
