package regional

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"math/rand"
	"net"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/redistest"
)

// BenchmarkOneCaller is the c=1 path of scripts/bench-regional.sh in
// process: one caller at a time checks one descriptor of 10,000 uniform
// subjects on a node whose store is real Redis over loopback (the shared
// redistest server: run it under scripts/with-redis.sh), with the node's
// production defaults (grants, in-flight bound, live-subject bound, salted
// subject hashing, one flusher per P). "handler" calls the Envoy handler
// itself; "grpc" goes through a loopback gRPC client and server as Envoy
// does; "handler-c50" calls the handler from 50 goroutines per P at once;
// "leased" and "leased-c50" call the handler (at c=1 and c=50) for one hot
// subject of a rule with node leases on (benchLeased), decided from the
// node's lease: redis-rt/op is then the renewals' share of a check.
// Beside ns/op and allocations it reports, per check:
//
//   - cpu-ns/op: the process's user and system CPU time (getrusage), which
//     leaves out the wait for Redis that ns/op includes;
//   - rw-syscalls/op: read and write system calls of the process
//     (/proc/self/io syscr + syscw; epoll and futex calls are not counted);
//   - redis-rt/op: writes on the Redis connections (one per round trip);
//   - ctxsw/op: the process's OS context switches (getrusage nvcsw +
//     nivcsw), that is, times a thread slept and was woken;
//   - g-runs/op: goroutines made runnable and then run (the count of
//     /sched/latencies:seconds, which the runtime samples at one in 8
//     transitions per goroutine, times 8): every hand-off from one
//     goroutine to another, and every wake-up from the network poller,
//     is one.
//
// Run it on one P, as the script runs the node (taskset on one CPU):
//
//	scripts/with-redis.sh go test -run '^$' -bench OneCaller -cpu 1 -benchtime 20000x ./internal/regional/
func BenchmarkOneCaller(b *testing.B) {
	writes := new(atomic.Int64)
	rc := redis.NewClient(&redis.Options{
		Addr: redistest.Addr(b), Protocol: 2, ContextTimeoutEnabled: true, MaxRetries: -1,
		ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c, writes: writes}, nil
		},
	})
	b.Cleanup(func() { _ = rc.Close() })
	store, err := bucket.NewRedis(bucket.RedisConfig{Client: rc, Flushers: min(bucket.DefaultFlushers, runtime.GOMAXPROCS(0))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	h := startNode(b, Config{StoreTimeout: 250 * time.Millisecond, Store: store,
		Local: memoryStore(b, clock.Real{})}, map[string]string{"e.yaml": benchEnvoy, "l.yaml": benchLeased, "d.yaml": benchD10})
	// The harness counts the store's calls under a lock: call the store
	// itself, as a node does (and lease from it).
	h.node.cfg.Store = h.store.Store
	h.node.leases = newNodeLeases(h.node, store)
	r := &rls{n: h.node}
	prefix := redistest.Unique(b)
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", prefix+"-"+strconv.Itoa(i))}}
	}
	calls := map[string]func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error){
		"handler": r.ShouldRateLimit,
		"grpc": func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			return h.rls.ShouldRateLimit(ctx, req)
		},
	}
	for _, name := range []string{"handler", "grpc"} {
		call := calls[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			for i := range 200 { // warm: connections, script cache, live subjects
				if _, err := call(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			before := sampleProcess(b, writes)
			b.ResetTimer()
			i := 0
			for b.Loop() {
				resp, err := call(ctx, reqs[i%len(reqs)])
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatal(resp, err)
				}
				i++
			}
			b.StopTimer()
			sampleProcess(b, writes).report(b, before, i)
		})
	}
	hot := &rlsv3.RateLimitRequest{Domain: "benchlease",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", prefix+"-hot")}}
	for _, c := range []int{1, 50} {
		name := "leased"
		if c > 1 {
			name += "-c" + strconv.Itoa(c)
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			// Warm: the subject turns hot, is leased, and the lease grows
			// to the rate the callers check at.
			var warm sync.WaitGroup
			for range c * runtime.GOMAXPROCS(0) {
				warm.Add(1)
				go func() {
					defer warm.Done()
					for end := time.Now().Add(time.Second); time.Now().Before(end); {
						_, _ = r.ShouldRateLimit(ctx, hot)
					}
				}()
			}
			warm.Wait()
			b.ReportAllocs()
			b.SetParallelism(c)
			var n atomic.Int64
			before := sampleProcess(b, writes)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := r.ShouldRateLimit(ctx, hot)
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Error(resp, err)
						return
					}
					n.Add(1)
				}
			})
			b.StopTimer()
			sampleProcess(b, writes).report(b, before, int(n.Load()))
		})
	}
	// handler-c50: 50 callers per P at once on the handler, as the c=50
	// runs of the script load the node: redis-rt/op shows how many checks
	// share a round trip (merged and pipelined).
	// handler-c50-zipf is handler-c50 with Zipf-distributed subjects (s=1.1
	// over the same 10,000), as the script's Zipf run: most checks find
	// their subject live, so the gap to handler-c50 is what a cold subject
	// costs.
	zipf := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, uint64(len(reqs)-1))
	zipfOrder := make([]int, 1<<16)
	for i := range zipfOrder {
		zipfOrder[i] = int(zipf.Uint64())
	}
	orders := map[string]func(i int64) int{
		"handler-c50":      func(i int64) int { return int(i % int64(len(reqs))) },
		"handler-c50-zipf": func(i int64) int { return zipfOrder[i%int64(len(zipfOrder))] },
	}
	for _, name := range []string{"handler-c50", "handler-c50-zipf"} {
		benchHandlerC50(b, name, r, reqs, orders[name], writes)
	}
	// handler-c50-d10: requests of 10 descriptors, each of its own rule,
	// as the script's d10 run (its figures are per request of 10 checks).
	d10 := make([]*rlsv3.RateLimitRequest, len(reqs))
	for i := range d10 {
		req := &rlsv3.RateLimitRequest{Domain: "benchd10"}
		for k := range 10 {
			req.Descriptors = append(req.Descriptors, desc("tenant"+strconv.Itoa(k), prefix+"-"+strconv.Itoa(i)))
		}
		d10[i] = req
	}
	benchHandlerC50(b, "handler-c50-d10", r, d10, orders["handler-c50"], writes)
}

// benchHandlerC50 runs 50 callers per P at once on the handler, the i-th
// check asking for reqs[order(i)].
func benchHandlerC50(b *testing.B, name string, r *rls, reqs []*rlsv3.RateLimitRequest, order func(int64) int, writes *atomic.Int64) {
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(50)
		var n, next atomic.Int64
		before := sampleProcess(b, writes)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := r.ShouldRateLimit(context.Background(), reqs[order(next.Add(1))])
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Error(resp, err)
					return
				}
				n.Add(1)
			}
		})
		b.StopTimer()
		sampleProcess(b, writes).report(b, before, int(n.Load()))
	})
}

// countingConn counts the writes on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// SyscallConn is the socket's, as on the *net.TCPConn that production
// dials: go-redis checks a pooled connection's health through it (a
// non-blocking recvfrom on every pool Get), and skips the check for a
// connection that does not offer it.
func (c *countingConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("countingConn: the dialed connection has no SyscallConn")
	}
	return sc.SyscallConn()
}

// processSample is what BenchmarkOneCaller reads of the process before and
// after its loop.
type processSample struct {
	cpu      time.Duration
	ctxsw    int64
	syscalls int64
	gruns    uint64
	writes   int64
}

func sampleProcess(b *testing.B, writes *atomic.Int64) processSample {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	s := processSample{
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		ctxsw:  ru.Nvcsw + ru.Nivcsw,
		writes: writes.Load(),
	}
	if io, err := os.ReadFile("/proc/self/io"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(io))
		for sc.Scan() {
			k, v, _ := bytes.Cut(sc.Bytes(), []byte(": "))
			if n, err := strconv.ParseInt(string(v), 10, 64); err == nil && (string(k) == "syscr" || string(k) == "syscw") {
				s.syscalls += n
			}
		}
	}
	m := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
	rtmetrics.Read(m)
	if m[0].Value.Kind() == rtmetrics.KindFloat64Histogram {
		for _, c := range m[0].Value.Float64Histogram().Counts {
			s.gruns += c
		}
	}
	return s
}

// gTrackingPeriod is the runtime's sampling period of scheduling
// latencies (runtime.gTrackingPeriod).
const gTrackingPeriod = 8

func (s processSample) report(b *testing.B, before processSample, n int) {
	if n == 0 {
		return
	}
	per := func(v float64) float64 { return v / float64(n) }
	b.ReportMetric(per(float64(s.cpu-before.cpu)), "cpu-ns/op")
	b.ReportMetric(per(float64(s.syscalls-before.syscalls)), "rw-syscalls/op")
	b.ReportMetric(per(float64(s.writes-before.writes)), "redis-rt/op")
	b.ReportMetric(per(float64(s.ctxsw-before.ctxsw)), "ctxsw/op")
	b.ReportMetric(per(float64(gTrackingPeriod*(s.gruns-before.gruns))), "g-runs/op")
}
