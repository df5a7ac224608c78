package regional

import (
	"context"
	"net"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/clock"
)

// goroutinesCreated is the number of goroutines the process has created.
func goroutinesCreated(t *testing.T) uint64 {
	m := []rtmetrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	rtmetrics.Read(m)
	if m[0].Value.Kind() != rtmetrics.KindUint64 {
		t.Fatal("runtime/metrics has no /sched/goroutines-created:goroutines (Go 1.26 or later needed)")
	}
	return m[0].Value.Uint64()
}

// TestConcurrentChecksRunOnStreamWorkers: 50 checks in flight at once on
// the node's gRPC server (grpcServerOptions) run on its stream workers,
// whose stacks have grown already, not on a new goroutine each, whose
// stack would grow through the check path again.
func TestConcurrentChecksRunOnStreamWorkers(t *testing.T) {
	gs := newGateStore(memoryStore(t, clock.Real{}))
	h := startNode(t, Config{Store: gs, StoreTimeout: 10 * time.Second}, map[string]string{"e.yaml": benchEnvoy})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpcServerOptions()...)
	h.node.Register(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const callers = 50
	// round holds every caller's check in the store until all are in.
	round := func() {
		entered, release := gs.arm()
		defer release()
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", strconv.Itoa(i))}}
				if _, err := client.ShouldRateLimit(ctx, req); err != nil {
					t.Error(err)
				}
			})
		}
		for n := range callers {
			select {
			case <-entered:
			case <-ctx.Done():
				t.Fatalf("%d of %d checks reached the store", n, callers)
			}
		}
		release()
		wg.Wait()
	}
	round() // the connection's and the workers' first use
	before := goroutinesCreated(t)
	round()
	created := goroutinesCreated(t) - before
	t.Logf("%d goroutines created for %d concurrent checks (%d of them the callers)", created, callers, callers)
	if created > callers+callers/5 {
		t.Fatalf("%d goroutines created for %d concurrent checks by %d callers: the server started a goroutine per check", created, callers, callers)
	}
}
