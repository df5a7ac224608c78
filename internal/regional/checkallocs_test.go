package regional

import (
	"context"
	"testing"

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
