package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/cputime"
	"github.com/quotacoord/quota/internal/redistest"
)

var benchLimits = bucket.Limits{Capacity: 1_000_000, RefillPerSecond: 100_000, IdleTTL: time.Minute}

func BenchmarkMemoryTakeHotKey(b *testing.B) {
	m, _ := bucket.NewMemory(bucket.MemoryConfig{})
	k, _ := bucket.NewKey("p", 1, "hot")
	req := bucket.Request{Key: k, Limits: benchLimits, Share: 0.5, Cost: 1}
	now := t0
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		now = now.Add(100 * time.Nanosecond)
		if _, err := m.TakeAt(now, req); err != nil {
			b.Fatal(err)
		}
	}
	reportDecisions(b, cpu0)
}

func BenchmarkMemoryTakeUniform100k(b *testing.B) { benchMemoryUniform(b, "u", false) }

// BenchmarkMemoryTakeUniform100kShuffled is BenchmarkMemoryTakeUniform100k
// with the keys taken in a random order, not the order they were created
// in (which was also the order of their entries in memory before entries
// moved into the index).
func BenchmarkMemoryTakeUniform100kShuffled(b *testing.B) { benchMemoryUniform(b, "s", true) }

// benchMemoryUniform takes from 100,000 buckets (subjects prefix0 to
// prefix99999), each once per round, in creation order or shuffled.
func benchMemoryUniform(b *testing.B, prefix string, shuffle bool) {
	m, _ := bucket.NewMemory(bucket.MemoryConfig{})
	keys := subjectKeys(b, prefix, 100_000)
	reqs := make([]bucket.Request, len(keys))
	for i, k := range keys {
		reqs[i] = bucket.Request{Key: k, Limits: benchLimits, Share: 0.5, Cost: 1}
		_, _ = m.TakeAt(t0, reqs[i])
	}
	if shuffle {
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	}
	now := t0
	i := 0
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		now = now.Add(100 * time.Nanosecond)
		if _, err := m.TakeAt(now, reqs[i]); err != nil {
			b.Fatal(err)
		}
		if i++; i == len(reqs) {
			i = 0
		}
	}
	reportDecisions(b, cpu0)
}

// reportDecisions reports b.N decisions per second of the benchmark's wall
// time and per CPU-second of the process since cpu0 (taken just before the
// loop): other processes on a shared machine lower the first, much less the
// second.
func reportDecisions(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	if cpu := cputime.Process() - cpu0; cpu > 0 {
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "decisions/cpu-s")
	}
}

// BenchmarkMemoryBytesPerBucket reports the heap a Memory holds per live
// token bucket (100,000 buckets of distinct subjects; the keys' strings,
// which the caller built, are not counted), and that a sweep after their
// TTL gives it back.
func BenchmarkMemoryBytesPerBucket(b *testing.B) {
	keys := subjectKeys(b, "b", 100_000)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var per, left float64
	for b.Loop() {
		before := heap()
		m, _ := bucket.NewMemory(bucket.MemoryConfig{})
		for _, k := range keys {
			if _, err := m.TakeAt(t0, bucket.Request{Key: k, Limits: benchLimits, Share: 0.5, Cost: 1}); err != nil {
				b.Fatal(err)
			}
		}
		per = (float64(heap()) - float64(before)) / float64(len(keys))
		if n := m.Sweep(t0.Add(benchLimits.IdleTTL)); n != len(keys) || m.Len() != 0 {
			b.Fatalf("sweep dropped %d, Len %d", n, m.Len())
		}
		left = (float64(heap()) - float64(before)) / float64(len(keys))
		runtime.KeepAlive(m)
	}
	b.ReportMetric(per, "bytes/bucket")
	b.ReportMetric(left, "bytes/bucket-after-sweep")
}

func BenchmarkMemoryTakeParallel(b *testing.B) {
	m, _ := bucket.NewMemory(bucket.MemoryConfig{})
	keys := subjectKeys(b, "par", 100_000)
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(7919))
		now := t0
		for pb.Next() {
			now = now.Add(100 * time.Nanosecond)
			req := bucket.Request{Key: keys[i%len(keys)], Limits: benchLimits, Share: 0.5, Cost: 1}
			if _, err := m.TakeAt(now, req); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// benchRedisAddr is the Redis the benchmarks use: BUCKET_BENCH_REDIS when
// set (scripts/bench-bucket.sh), else the test Redis.
func benchRedisAddr(b *testing.B) string {
	if a := os.Getenv("BUCKET_BENCH_REDIS"); a != "" {
		return a
	}
	return redistest.Addr(b)
}

// BenchmarkRedisTake: Take at 1 and 64 concurrent callers, with the
// store's defaults; "unmerged" sends each call as a script call of its
// own (Merge 1), pipelined only.
func BenchmarkRedisTake(b *testing.B) {
	for _, bc := range []struct {
		name    string
		callers int
		merge   int
	}{
		{"callers=1", 1, 0},
		{"callers=64", 64, 0},
		{"unmerged/callers=64", 64, 1},
	} {
		b.Run(bc.name, func(b *testing.B) { benchRedisTake(b, bc.callers, bc.merge) })
	}
}

func benchRedisTake(b *testing.B, callers, merge int) {
	addr := benchRedisAddr(b)
	keys := subjectKeys(b, "bench-", 10_000)
	// The client production uses (bucket.DialRedis: RESP2, no
	// maintenance notifications), so the figure is the node's.
	c, err := bucket.DialRedis(addr, bucket.DialOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Merge: merge})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	var seq atomic.Int64
	// RunParallel starts parallelism*GOMAXPROCS goroutines.
	b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var admitted atomic.Int64
	b.ResetTimer()
	if callers == 1 {
		i := 0
		for b.Loop() {
			d, err := r.Take(ctx, bucket.Request{Key: keys[i%len(keys)], Limits: benchLimits, Share: 1, Cost: 1})
			if err != nil {
				b.Fatal(err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
			i++
		}
	} else {
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(7919))
			for pb.Next() {
				d, err := r.Take(ctx, bucket.Request{Key: keys[i%len(keys)], Limits: benchLimits, Share: 1, Cost: 1})
				if err != nil {
					b.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
				i++
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	if admitted.Load() == 0 {
		b.Fatal("nothing admitted")
	}
}

// BenchmarkRedisBytesPerBucket creates 100,000 token buckets and reports
// the growth of used_memory per bucket (TestRedisBytesPerBucket holds it
// to at most 100).
func BenchmarkRedisBytesPerBucket(b *testing.B) {
	var c *redis.Client
	if a := os.Getenv("BUCKET_BENCH_REDIS"); a != "" {
		c = redis.NewClient(&redis.Options{Addr: a})
		defer c.Close()
	} else {
		c = redistest.Start(b).Client(b)
	}
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	u := "m" + strconv.FormatInt(time.Now().UnixNano()%1_000_000, 36)
	for b.Loop() {
		per, err := bytesPerBucket(c, r, u+"-", 100_000)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(per, "bytes/bucket")
		u += "x"
	}
}

func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO memory: %w", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no used_memory in INFO memory")
}
