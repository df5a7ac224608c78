package regional

import (
	"fmt"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/demand"
)

// TestDemandInflationCapped is an attack on the demand reports: a caller
// behind Envoy sends a denied hits_addend of 2^53 (and the same descriptor
// 64 times in one request) once per report interval, which used to count
// as 2^53 of offered demand and drag the region's share of the policy
// towards it. Each request now adds at most the policy's capacity per
// bucket, so the attacker moves the report by no more than one full
// bucket per request, however large its hits_addend.
func TestDemandInflationCapped(t *testing.T) {
	clk := clock.NewManual(t0)
	rec, err := demand.New(demand.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Demand: rec}, map[string]string{"sem.yaml": semanticsConfig})
	const capacity = 3 // policy sem.k: 3 per minute
	send := func(ds ...*rlcommon.RateLimitDescriptor) {
		t.Helper()
		if _, err := h.rls.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	huge := func() *rlcommon.RateLimitDescriptor {
		d := desc("k", "attacker")
		d.HitsAddend = wrapperspb.UInt64(MaxCost)
		return d
	}
	honest := 0
	for i := 0; i < 10; i++ {
		for j := 0; j < 2; j++ {
			send(desc("k", fmt.Sprintf("tenant-%d", i)))
			honest++
		}
	}
	attackerRequests := 2
	send(huge())
	many := make([]*rlcommon.RateLimitDescriptor, MaxDescriptors)
	for i := range many {
		many[i] = huge()
	}
	send(many...)

	rep := rec.Snapshot(t0.Add(time.Second))
	var got float64
	for name, pd := range rep {
		if name != "sem.k" {
			t.Fatalf("demand reported for %s: %+v", name, pd)
		}
		got = pd.Offered
		for _, s := range pd.Pressured {
			if s.Offered > float64(attackerRequests*capacity) {
				t.Fatalf("subject %s reported with offered %v/s from %d requests; at most %d (capacity per request)",
					s.Subject, s.Offered, attackerRequests, attackerRequests*capacity)
			}
		}
	}
	if max := float64(honest + attackerRequests*capacity); got > max || got < float64(honest) {
		t.Fatalf("offered demand %v/s after %d honest requests of cost 1 and %d attacking ones; want %d to %v",
			got, honest, attackerRequests, honest, max)
	}
}
