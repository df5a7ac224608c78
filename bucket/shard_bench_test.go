package bucket_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/cputime"
)

// hotKeyShards are the splits BenchmarkHotKey compares: one bucket, and
// six sub-buckets (two per master of a three-master cluster).
var hotKeyShards = []int{1, 6}

// hotKeyMerges are the store's Merge settings it compares: the default
// (concurrent takes of one slot merged into one script call) and 1 (one
// script call per take).
var hotKeyMerges = []int{0, 1}

// BenchmarkHotKey takes cost 1 from one global bucket (one policy, one
// subject: "10,000 requests a second for the whole API") through a Redis
// store on a Redis Cluster, from 64 concurrent callers, with the bucket
// whole or split into sub-buckets (Limits.Shards). The clusters come from
// HOTKEY_CLUSTERS, "masters=seed,seed;masters=seed,...", as
// scripts/bench-hotkey.sh starts them; without it the benchmark skips.
//
// Besides decisions/s it reads every master's INFO CPU before and after
// and reports the busiest master's share of the Redis CPU time and its CPU
// time per decision: a whole bucket puts all of it on one master, which
// caps the policy at what one Redis core decides; sub-buckets spread it.
func BenchmarkHotKey(b *testing.B) {
	env := os.Getenv("HOTKEY_CLUSTERS")
	if env == "" {
		b.Skip("HOTKEY_CLUSTERS not set (scripts/bench-hotkey.sh sets it)")
	}
	for _, spec := range strings.Split(env, ";") {
		masters, seeds, ok := strings.Cut(spec, "=")
		if !ok {
			b.Fatalf("HOTKEY_CLUSTERS: %q is not masters=seed,seed", spec)
		}
		for _, merge := range hotKeyMerges {
			for _, k := range hotKeyShards {
				b.Run(fmt.Sprintf("masters=%s/shards=%d/merge=%d", masters, k, merge), func(b *testing.B) {
					benchHotKey(b, strings.Split(seeds, ","), k, merge)
				})
			}
		}
	}
}

func benchHotKey(b *testing.B, seeds []string, shards, merge int) {
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds, PoolSize: 64})
	defer c.Close()
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Merge: merge})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	k, err := bucket.NewKey("global", uint32(time.Now().UnixNano()), "api")
	if err != nil {
		b.Fatal(err)
	}
	lim := bucket.Limits{Capacity: 100_000_000, RefillPerSecond: 10_000_000, IdleTTL: time.Minute, Shards: shards}
	req := bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1}
	if _, err := r.Take(ctx, req); err != nil {
		b.Fatal(err)
	}
	cpu0, err := masterCPU(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	own0 := cputime.Process()
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := r.Take(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			if !d.Allowed {
				b.Error("denied: the benchmark's bucket must never run dry")
				return
			}
		}
	})
	b.StopTimer()
	reportDecisions(b, own0)
	cpu1, err := masterCPU(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	var total, busiest float64
	for addr, t := range cpu1 {
		d := t - cpu0[addr]
		total += d
		busiest = max(busiest, d)
	}
	if total > 0 {
		b.ReportMetric(100*busiest/total, "busiest-master-%")
		b.ReportMetric(busiest/float64(b.N)*1e6, "busiest-master-µs/decision")
	}
}

// masterCPU returns each master's used_cpu_user + used_cpu_sys (seconds).
func masterCPU(ctx context.Context, c *redis.ClusterClient) (map[string]float64, error) {
	var mu sync.Mutex
	out := map[string]float64{}
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		var sum float64
		for _, line := range strings.Split(info, "\n") {
			name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return fmt.Errorf("INFO cpu %s: %w", name, err)
				}
				sum += f
			}
		}
		mu.Lock()
		out[m.Options().Addr] = sum
		mu.Unlock()
		return nil
	})
	return out, err
}
