package regional

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotacoord/quota/internal/redistest"
)

const benchEnvoy = "domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"

// BenchmarkShouldRateLimit drives the Envoy API over loopback gRPC, in
// parallel, against the in-process store and against real Redis, with
// the standalone share source (no pins).
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, backend := range []string{"memory", "redis"} {
		b.Run(backend, func(b *testing.B) {
			cfg := Config{StoreTimeout: time.Second}
			if backend == "redis" {
				cfg.Store = redisStore(b, redistest.Client(b))
			}
			h := startNode(b, cfg, map[string]string{"e.yaml": benchEnvoy})
			prefix := redistest.Unique(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					_, err := h.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "bench",
						Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", prefix+"-"+strconv.Itoa(i%1000))}})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkShouldRateLimitInProcess calls the Envoy handler directly (no
// gRPC), in parallel, on the in-process store: the node's own cost per
// request, with the standalone share source and with a real regionsync
// Syncer (against embedded etcd, share 0.5 published) whose pins every
// request takes and ends.
func BenchmarkShouldRateLimitInProcess(b *testing.B) {
	// Started once: a sub-benchmark body runs once per b.N tried.
	nodes := map[string]*Node{
		"standalone": startNode(b, Config{StoreTimeout: time.Second}, map[string]string{"e.yaml": benchEnvoy}).node,
		"pinned":     startPinEnv(b, time.Second).h.node,
	}
	for _, src := range []string{"standalone", "pinned"} {
		b.Run(src, func(b *testing.B) {
			domain := "bench"
			if src == "pinned" {
				domain = "pins" // the same rule as benchEnvoy, at share 0.5
			}
			r := &rls{n: nodes[src]}
			prefix := redistest.Unique(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					resp, err := r.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
						Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", prefix+"-"+strconv.Itoa(i%1000))}})
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Fatal(resp, err)
					}
				}
			})
		})
	}
}
