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
// parallel, against the in-process store and against real Redis.
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
