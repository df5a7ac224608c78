package bucket_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

func newRedis(t testing.TB, c bucket.RedisClient) *bucket.Redis {
	t.Helper()
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// On the Redis side, time is controlled by an ARGV "now" that only tests
// pass (bucket.SetRedisNow, in export_test.go); production reads Redis TIME.
func TestRedisSteps(t *testing.T) {
	r := newRedis(t, redistest.Client(t))
	var now int64
	bucket.SetRedisNow(r, func() int64 { return now })
	runSteps(t, redisDriver{r, &now}, redistest.Unique(t))
}

// TestDifferential drives Memory and Redis through the same random
// sequences of takes, peeks, refunds, TakeAlls, share changes and time
// steps (forward, backward, beyond the idle TTL) and demands equal
// decisions.
//
// It runs three times: with the default groups (the two subjects almost
// surely in different group hashes); with every bucket of a policy in one
// group hash: eight subjects, subjects seen once, more steps and longer
// idle jumps (past two TTLs), so that writes prune each other's stale
// fields: pruning must never change a decision; and with LossGuard on a
// private server whose every key is lost now and then (FLUSHALL, while
// Memory starts again empty), eight subjects in four groups. Every run
// moves keys to a new version now and then, with Since the instant of
// the move.
func TestDifferential(t *testing.T) {
	for _, tc := range []struct {
		name     string
		groups   int
		subjects []string
		jump     int64 // microseconds, past the 30 s idle TTL
		steps    int
		churn    bool // add subjects seen once
		guard    bool // LossGuard on a private server, with losses
	}{
		{"default groups", 0, []string{"a", "b"}, 31_000_000, 400, false, false},
		{"one group", 1, []string{"a", "b", "c", "d", "e", "f", "g", "h"}, 61_000_000, 1000, true, false},
		{"loss guard", 4, []string{"a", "b", "c", "d", "e", "f", "g", "h"}, 31_000_000, 1000, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redistest.Client(t)
			if tc.guard {
				c = redistest.Start(t).Client(t)
			}
			r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Groups: tc.groups, LossGuard: tc.guard})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close() })
			var lose func() error
			if tc.guard {
				lose = func() error { return c.FlushAll(context.Background()).Err() }
			}
			mcfg := bucket.MemoryConfig{LossGuard: tc.guard, Groups: tc.groups}
			differential(t, r, mcfg, lose, tc.subjects, tc.jump, tc.steps, tc.churn)
		})
	}
}

// differential runs the random sequences on r and on Memories built with
// mcfg; lose, when set, empties r's server, and the run then starts a new
// Memory beside it.
func differential(t *testing.T, r *bucket.Redis, mcfg bucket.MemoryConfig, lose func() error, subjects []string, jump int64, steps int, churn bool) {
	var now int64
	bucket.SetRedisNow(r, func() int64 { return now })
	ctx := context.Background()
	algs := []bucket.Limits{
		{Capacity: 7, RefillPerSecond: 2.5, IdleTTL: 30 * time.Second},
		{Capacity: 5, IdleTTL: 30 * time.Second},
		{Capacity: 1000, RefillPerSecond: 333.3, IdleTTL: 30 * time.Second, Overcommit: 0.2},
		{Algorithm: bucket.FixedWindow, Capacity: 9, Window: 700 * time.Millisecond, IdleTTL: 30 * time.Second},
		{Algorithm: bucket.SlidingWindow, Capacity: 9, Window: 700 * time.Millisecond, IdleTTL: 30 * time.Second},
		{Algorithm: bucket.SlidingLog, Capacity: 6, Window: 900 * time.Millisecond, IdleTTL: 30 * time.Second, Overcommit: 0.5},
	}
	for ai, lim := range algs {
		t.Run(fmt.Sprintf("%d-%s", ai, lim.Algorithm), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ai), 42))
			m, err := bucket.NewMemory(mcfg)
			if err != nil {
				t.Fatal(err)
			}
			if lose != nil {
				if err := lose(); err != nil {
					t.Fatal(err)
				}
			}
			u := redistest.Unique(t)
			var keys []bucket.Key
			for _, subj := range subjects {
				for _, pol := range []string{"p1", "p2"} {
					k, err := bucket.NewKey(pol, 1, u+subj)
					if err != nil {
						t.Fatal(err)
					}
					keys = append(keys, k)
				}
			}
			// withheld is the part of the share a bucket created by a
			// request starts without (Request.Withheld): 0 for most
			// keys, up to the whole share for some.
			share, withheld := map[bucket.Key]float64{}, map[bucket.Key]float64{}
			since := map[bucket.Key]time.Time{} // keys moved to a new version: when
			for _, k := range keys {
				share[k] = 1
			}
			now = t0.UnixMicro()
			req := func(k bucket.Key, cost int64) bucket.Request {
				return bucket.Request{Key: k, Limits: lim, Share: share[k], Cost: cost, Withheld: withheld[k], Since: since[k]}
			}
			losses, moves := 0, 0
			defer func() { t.Logf("losses %d, key versions moved %d", losses, moves) }()
			tally := map[bool]int{}
			defer func() { t.Logf("allowed %d, denied %d", tally[true], tally[false]) }()
			for step := 0; step < steps; step++ {
				switch x := rng.IntN(100); {
				case x < 30:
					now += rng.Int64N(2000)
				case x < 40:
					now += rng.Int64N(2_000_000)
				case x < 43:
					now -= rng.Int64N(500_000)
				case x < 45:
					now += jump // past the idle TTL
				}
				if lose != nil && rng.IntN(150) == 0 {
					// the store loses every key: Redis is flushed, and
					// a new Memory is one that lost its state
					if err := lose(); err != nil {
						t.Fatal(err)
					}
					if m, err = bucket.NewMemory(mcfg); err != nil {
						t.Fatal(err)
					}
					losses++
				}
				ki := rng.IntN(len(keys))
				if rng.IntN(50) == 0 {
					// a policy edit: the key moves to a new version
					old := keys[ki]
					nk, err := bucket.NewKey(old.Policy(), old.Version()+1, old.Subject())
					if err != nil {
						t.Fatal(err)
					}
					keys[ki] = nk
					share[nk], withheld[nk], since[nk] = share[old], withheld[old], time.UnixMicro(now)
					moves++
				}
				k := keys[ki]
				if rng.IntN(10) == 0 {
					share[k] = 0.05 + rng.Float64()*(0.95+lim.Overcommit)
					withheld[k] = 0
					if rng.IntN(2) == 0 {
						withheld[k] = share[k] * rng.Float64()
					}
				}
				at := time.UnixMicro(now)
				if churn && rng.IntN(2) == 0 {
					// a subject seen once: its field's creation prunes
					ck, err := bucket.NewKey(k.Policy(), 1, fmt.Sprintf("%sc%d", u, step))
					if err != nil {
						t.Fatal(err)
					}
					cr := bucket.Request{Key: ck, Limits: lim, Share: 1, Cost: 1, Withheld: float64(rng.IntN(3)) / 2}
					w, werr := m.TakeAt(at, cr)
					g, gerr := r.Take(ctx, cr)
					if werr != nil || gerr != nil || w != g {
						t.Fatalf("step %d churn %s: memory %+v, %v; redis %+v, %v", step, ck, w, werr, g, gerr)
					}
				}
				var want, got []bucket.Decision
				var werr, gerr error
				switch x := rng.IntN(100); {
				case x < 55:
					c := rng.Int64N(lim.Capacity/2 + 2)
					var w, g bucket.Decision
					w, werr = m.TakeAt(at, req(k, c))
					g, gerr = r.Take(ctx, req(k, c))
					want, got = []bucket.Decision{w}, []bucket.Decision{g}
				case x < 65:
					var w, g bucket.Decision
					w, werr = m.TakeAt(at, req(k, 0))
					g, gerr = r.Take(ctx, req(k, 0))
					want, got = []bucket.Decision{w}, []bucket.Decision{g}
				case x < 80:
					c := rng.Int64N(lim.Capacity/3 + 1)
					var w, g bucket.Decision
					w, werr = m.RefundAt(at, req(k, c))
					g, gerr = r.Refund(ctx, req(k, c))
					want, got = []bucket.Decision{w}, []bucket.Decision{g}
				default:
					// both policies of one subject, all or nothing
					base := rng.IntN(len(subjects)) * 2
					rs := []bucket.Request{req(keys[base], rng.Int64N(lim.Capacity/2+1)), req(keys[base+1], rng.Int64N(lim.Capacity/2+1))}
					want, werr = m.TakeAllAt(at, rs)
					got, gerr = r.TakeAll(ctx, rs)
				}
				if werr != nil || gerr != nil {
					t.Fatalf("step %d: memory error %v, redis error %v", step, werr, gerr)
				}
				for i := range want {
					tally[want[i].Allowed]++
					if want[i] != got[i] {
						t.Fatalf("step %d at %d, key %s, share %v:\nmemory %+v\nredis  %+v", step, now, k, share[k], want[i], got[i])
					}
				}
			}
		})
	}
}

// TestRedisTakeAllCompensates checks that a TakeAll across two subjects (two
// script calls) refunds the admitted subject when the other denies.
func TestRedisTakeAllCompensates(t *testing.T) {
	r := newRedis(t, redistest.Client(t))
	ctx := context.Background()
	u := redistest.Unique(t)
	lim := bucket.Limits{Capacity: 10, IdleTTL: time.Minute}
	ka, _ := bucket.NewKey("p", 1, u+"a")
	kb, _ := bucket.NewKey("p", 1, u+"b")
	if _, err := r.Take(ctx, bucket.Request{Key: kb, Limits: lim, Share: 1, Cost: 8}); err != nil {
		t.Fatal(err)
	}
	ds, err := r.TakeAll(ctx, []bucket.Request{
		{Key: ka, Limits: lim, Share: 1, Cost: 5},
		{Key: kb, Limits: lim, Share: 1, Cost: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("TakeAll admitted: %+v", ds)
	}
	if ds[0].Remaining != 10 || ds[1].Remaining != 2 || ds[1].RetryAfter == 0 {
		t.Fatalf("decisions %+v, want a refunded to 10 and b blocking at 2", ds)
	}
	d, err := r.Take(ctx, bucket.Request{Key: ka, Limits: lim, Share: 1})
	if err != nil || d.Remaining != 10 {
		t.Fatalf("peek after compensation: %+v, %v; want 10 remaining", d, err)
	}
}

// exactly runs 500 goroutines, each taking cost once from one bucket of
// 100 without refill, through take, and returns how many were admitted.
func exactly(t *testing.T, cost int64, take func(i int, req bucket.Request) (bucket.Decision, error)) int64 {
	t.Helper()
	k, err := bucket.NewKey("exact", 1, redistest.Unique(t))
	if err != nil {
		t.Fatal(err)
	}
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 100, IdleTTL: time.Minute}, Share: 1, Cost: cost}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 500)
	for i := range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := take(i, req)
			if err != nil {
				errs <- err
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}

func TestExactUnderConcurrency(t *testing.T) {
	addr := redistest.Addr(t)
	stores := make([]*bucket.Redis, 10)
	for i := range stores {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
		t.Cleanup(func() { _ = c.Close() })
		stores[i] = newRedis(t, c)
	}
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cost int64
		want int64
	}{{1, 100}, {7, 14}} {
		t.Run(fmt.Sprintf("redis cost %d", tc.cost), func(t *testing.T) {
			got := exactly(t, tc.cost, func(i int, req bucket.Request) (bucket.Decision, error) {
				return stores[i%len(stores)].Take(context.Background(), req)
			})
			if got != tc.want {
				t.Fatalf("admitted %d, want exactly %d", got, tc.want)
			}
		})
		t.Run(fmt.Sprintf("memory cost %d", tc.cost), func(t *testing.T) {
			got := exactly(t, tc.cost, func(_ int, req bucket.Request) (bucket.Decision, error) {
				return m.TakeAt(t0, req)
			})
			if got != tc.want {
				t.Fatalf("admitted %d, want exactly %d", got, tc.want)
			}
		})
	}
}

func TestNoScriptRecovery(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := newRedis(t, c)
	ctx := context.Background()
	k, _ := bucket.NewKey("noscript", 1, "s")
	for _, alg := range []bucket.Limits{
		{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute},
		{Algorithm: bucket.SlidingLog, Capacity: 10, Window: time.Second, IdleTTL: time.Minute},
	} {
		req := bucket.Request{Key: k, Limits: alg, Share: 1, Cost: 1}
		if _, err := r.Take(ctx, req); err != nil {
			t.Fatalf("first take: %v", err)
		}
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("take after SCRIPT FLUSH: %+v, %v", d, err)
		}
		k, _ = bucket.NewKey("noscript2", 1, "s")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 10, IdleTTL: time.Minute}, Share: 1, Cost: 1}
	if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("take after restart: %+v, %v", d, err)
	}
}

func TestRedisErrorsAreReturned(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := newRedis(t, c)
	srv.Stop()
	k, _ := bucket.NewKey("down", 1, "s")
	_, err := r.Take(context.Background(), bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1, IdleTTL: time.Second}, Share: 1, Cost: 1})
	if err == nil {
		t.Fatal("take on a stopped Redis returned no error")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Take(context.Background(), bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1, IdleTTL: time.Second}, Share: 1, Cost: 1}); err == nil {
		t.Fatal("take on a closed store returned no error")
	}
}
