package regional

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestEnvoyCheckAllocations: a check of one descriptor keeps its rule
// match, its decisions and its store request in the one envoyCheck it
// allocates, so on a memory store a warm subject costs at most
// maxEnvoyCheckAllocs allocations per check (the envoyCheck, the hashed subject and what the
// store itself allocates; raceAllocs more under -race).
func TestEnvoyCheckAllocations(t *testing.T) {
	const maxEnvoyCheckAllocs = 5
	h := startNode(t, Config{}, map[string]string{"e.yaml": benchEnvoy})
	r := &rls{n: h.node}
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "acme")}}
	ctx := context.Background()
	check := func() {
		resp, err := r.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatal(resp, err)
		}
	}
	check()
	if n := testing.AllocsPerRun(200, check); n > maxEnvoyCheckAllocs+raceAllocs {
		t.Fatalf("a one-descriptor check allocates %v times, want at most %d", n, maxEnvoyCheckAllocs+raceAllocs)

	}
}

// countingClock is the wall clock, counting its readings.
type countingClock struct{ reads atomic.Int64 }

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return time.Now()
}

// TestEnvoyCheckReadsClockOnce: a check reads the node's clock once,
// whatever the number of descriptors (policies) it charges, rather than
// once per policy.
func TestEnvoyCheckReadsClockOnce(t *testing.T) {
	clk := &countingClock{}
	h := startNode(t, Config{Clock: clk}, map[string]string{"d.yaml": benchD10})
	r := &rls{n: h.node}
	req := &rlsv3.RateLimitRequest{Domain: "benchd10"}
	for k := range 10 {
		req.Descriptors = append(req.Descriptors, desc("tenant"+strconv.Itoa(k), "acme"))
	}
	before := clk.reads.Load()
	resp, err := r.ShouldRateLimit(context.Background(), req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(resp, err)
	}
	if n := clk.reads.Load() - before; n != 1 {
		t.Fatalf("a check of 10 descriptors read the clock %d times, want 1", n)
	}
}

// TestEnvoyMultiCheckRoom: a request of ten descriptors carries no room
// for a one-descriptor request (1 KiB it would clear and the collector
// would sweep on every such request): preparing it allocates at most
// maxMultiPrepareBytes (its ten subjects, rule matches, items and
// reply limits).
func TestEnvoyMultiCheckRoom(t *testing.T) {
	const maxMultiPrepareBytes = 6000
	h := startNode(t, Config{}, map[string]string{"d.yaml": benchD10})
	n := h.node
	req := &rlsv3.RateLimitRequest{Domain: "benchd10"}
	for k := range 10 {
		req.Descriptors = append(req.Descriptors, desc("tenant"+strconv.Itoa(k), "acme"))
	}
	set, perms := n.set.Load(), n.access.Load().anonymous
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			shares := n.beginShares()
			ec, err := n.prepareEnvoy(set, req, &shares, perms, time.Now())
			shares.end()
			if err != nil || len(ec.items) != 10 {
				b.Fatal(err)
			}
		}
	})
	if got := res.AllocedBytesPerOp(); got > maxMultiPrepareBytes {
		t.Fatalf("preparing a 10-descriptor request allocates %d bytes, want at most %d", got, maxMultiPrepareBytes)
	}
}
