package regional

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/bucket"
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

// failingStore fails every call with a store error (not bad input).
type failingStore struct{ err error }

func (f failingStore) Take(context.Context, bucket.Request) (bucket.Decision, error) {
	return bucket.Decision{}, f.err
}

func (f failingStore) TakeAll(context.Context, []bucket.Request) ([]bucket.Decision, error) {
	return nil, f.err
}

func (f failingStore) Refund(context.Context, bucket.Request) (bucket.Decision, error) {
	return bucket.Decision{}, f.err
}

// TestEnvoyUndecidedIsOverLimit: when even the failure mode cannot decide
// (the primary and the local store both fail), the Envoy API answers
// OVER_LIMIT rather than an error Envoy would admit on, and the reason
// it gives the client carries no internal error text.
func TestEnvoyUndecidedIsOverLimit(t *testing.T) {
	const secret = "redis-10.1.2.3:6379 internal detail"
	broken := failingStore{err: errors.New(secret)}
	h := startNode(t, Config{Store: broken, Local: broken}, map[string]string{"sem.yaml": semanticsConfig})
	resp, err := h.rls.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}})
	if err != nil {
		t.Fatalf("err = %v: Envoy admits on an error", err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	for _, hv := range resp.ResponseHeadersToAdd {
		if strings.Contains(hv.Value, "10.1.2.3") {
			t.Fatalf("header %s carries internal error text: %q", hv.Key, hv.Value)
		}
	}
}
