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

// benchD10 has ten rules, tenant0 to tenant9, for requests of ten
// descriptors, whose budgets no benchmark spends.
var benchD10 = func() string {
	s := "domain: benchd10\ndescriptors:\n"
	for k := range 10 {
		s += "  - key: tenant" + strconv.Itoa(k) + "\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"
	}
	return s
}()

// benchLeased is a rule with node leases on, whose budget no benchmark
// spends.
const benchLeased = "domain: benchlease\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100000000, burst: 100000000, lease: {fraction: 1, ttl: 2s}}\n"

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

// benchEnvoy10 has ten descriptor keys, d0 to d9, for requests that carry
// ten descriptors (one per key) as BenchmarkShouldRateLimitTenDescriptors
// and scripts/bench-regional.sh send.
var benchEnvoy10 = func() string {
	s := "domain: bench10\ndescriptors:\n"
	for k := range 10 {
		s += "  - key: d" + strconv.Itoa(k) + "\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"
	}
	return s
}()

// BenchmarkShouldRateLimitTenDescriptors calls the Envoy handler directly
// (no gRPC), in parallel, on the in-process store, with ten descriptors per
// request: the node's per-descriptor cost (matching, subjects, keys, one
// all-or-nothing decision over ten buckets) beside the one-descriptor
// BenchmarkShouldRateLimitInProcess.
func BenchmarkShouldRateLimitTenDescriptors(b *testing.B) {
	r := &rls{n: startNode(b, Config{StoreTimeout: time.Second}, map[string]string{"e.yaml": benchEnvoy10}).node}
	prefix := redistest.Unique(b)
	reqs := make([]*rlsv3.RateLimitRequest, 1000) // built before the timer: the requests a client sends
	for i := range reqs {
		descs := make([]*rlcommon.RateLimitDescriptor, 10)
		for k := range descs {
			descs[k] = desc("d"+strconv.Itoa(k), prefix+"-"+strconv.Itoa(i))
		}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench10", Descriptors: descs}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			resp, err := r.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 10 {
				b.Fatal(resp, err)
			}
		}
	})
}
