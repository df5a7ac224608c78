package regional

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/grants"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// manyPolicies is a policy file of n roomy policies p0, p1, ...
func manyPolicies(n int) map[string]string {
	var b strings.Builder
	b.WriteString("policies:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: p%d, capacity: 1000000, rate: 1000000/second}\n", i)
	}
	return map[string]string{"many.yaml": b.String()}
}

func policyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("p%d", i)
	}
	return names
}

// TestOversizedBatchRefusedBeforeStore: a CheckBatch of 256 checks of 16
// policies (4096 bucket operations, tens of milliseconds of Redis) is
// InvalidArgument before any store call; a batch of MaxBatchOps runs.
func TestOversizedBatchRefusedBeforeStore(t *testing.T) {
	h := startNode(t, Config{}, manyPolicies(MaxPolicies))
	batch := func(checks, policies int) *quotav1.CheckBatchRequest {
		req := &quotav1.CheckBatchRequest{}
		for i := range checks {
			req.Checks = append(req.Checks, &quotav1.CheckRequest{Subject: fmt.Sprintf("s%d", i), Policies: policyNames(policies)})
		}
		return req
	}
	_, err := h.adm.CheckBatch(ctxT(t), batch(MaxBatch, MaxPolicies))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 512") {
		t.Fatalf("batch of %d×%d: %v, want InvalidArgument naming the bound", MaxBatch, MaxPolicies, err)
	}
	if n := h.store.calls.Load(); n != 0 {
		t.Fatalf("oversized batch reached the store %d times", n)
	}
	if r, err := h.adm.CheckBatch(ctxT(t), batch(MaxBatchOps/MaxPolicies, MaxPolicies)); err != nil || len(r.Responses) != MaxBatchOps/MaxPolicies {
		t.Fatalf("batch of %d operations: %v", MaxBatchOps, err)
	}
	if n := counterValue(t, h.reg, "quota_regional_bucket_operations_total"); n != MaxBatchOps {
		t.Fatalf("bucket operations counted %v, want %d", n, MaxBatchOps)
	}
}

// TestEnvoyBucketOperationsCounted: an Envoy request counts one bucket
// operation per limited descriptor under api="envoy", beside the own
// API's.
func TestEnvoyBucketOperationsCounted(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{"e.yaml": benchEnvoy10})
	descs := []*rlcommon.RateLimitDescriptor{desc("d0", "a"), desc("d1", "a"), desc("unlimited-key", "a")}
	if r, err := h.rls.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "bench10", Descriptors: descs}); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("envoy request: %v, %v", r, err)
	}
	if _, err := h.adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: "s", Policies: []string{"unknown"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("check of an unknown policy: %v", err)
	}
	want := map[string]float64{"envoy": 2}
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "quota_regional_bucket_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "api" && m.GetCounter().GetValue() != 0 {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if len(got) != len(want) || got["envoy"] != want["envoy"] {
		t.Fatalf("bucket operations by api %v, want %v", got, want)
	}
}

// serialStore is a store that, like Redis, runs one call at a time and
// takes perBucket for each bucket. It records the most bucket operations
// of other callers queued or running when a call for subject "victim"
// arrived: the Redis time the victim waited behind.
type serialStore struct {
	bucket.Store
	perBucket time.Duration
	mu        sync.Mutex
	queued    atomic.Int64
	maxAhead  atomic.Int64
	victims   atomic.Int64
}

func (s *serialStore) TakeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	if reqs[0].Key.Subject() == "victim" {
		s.victims.Add(1)
		ahead := s.queued.Load()
		for m := s.maxAhead.Load(); ahead > m && !s.maxAhead.CompareAndSwap(m, ahead); m = s.maxAhead.Load() {
		}
	} else {
		s.queued.Add(int64(len(reqs)))
		defer s.queued.Add(-int64(len(reqs)))
	}
	s.mu.Lock()
	time.Sleep(s.perBucket * time.Duration(len(reqs)))
	s.mu.Unlock()
	return s.Store.TakeAll(ctx, reqs)
}

// TestCallerFloodBounded: one caller flooding the node with checks of 8
// policies from 16 connections at once holds at most CallerMaxInflight
// bucket operations in the store; its excess is denied at once (a denial
// marked degraded "closed" with a retry-after, counted; not an error,
// which clients failing open would admit), and another caller's checks
// are never refused and wait behind at most that many of the flood's
// operations.
func TestCallerFloodBounded(t *testing.T) {
	const bound = 32
	g, err := grants.Parse("g", []byte("callers: [{identities: [token:flood, token:victim], grants: [{actions: [check], policies: ['*']}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	toks, err := grants.ParseTokens("t", []byte("flood flood-token-0123456789\nvictim victim-token-0123456789\n"))
	if err != nil {
		t.Fatal(err)
	}
	store := &serialStore{Store: memoryStore(t, clock.Real{}), perBucket: 50 * time.Microsecond}
	h := startNode(t, Config{Store: store, StoreTimeout: 10 * time.Second, Grants: g, Tokens: toks, CallerMaxInflight: bound}, manyPolicies(8))
	as := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+tok)
	}
	ctx, stop := context.WithCancel(as("flood-token-0123456789"))
	defer stop()
	var wg sync.WaitGroup
	var refused, floodErrs atomic.Int64
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: fmt.Sprintf("f%d", i), Policies: policyNames(8)})
				switch {
				case err == nil && !r.Allowed && r.Degraded == "closed" && r.RetryAfter.AsDuration() > 0:
					refused.Add(1)
				case err == nil && r.Allowed, status.Code(err) == codes.Canceled:
				default:
					floodErrs.Add(1)
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond) // let the flood queue up
	for i := range 20 {
		r, err := h.adm.Check(as("victim-token-0123456789"), &quotav1.CheckRequest{Subject: "victim", Policies: []string{"p0"}})
		if err != nil || !r.Allowed {
			t.Fatalf("victim check %d: %v, %v", i, r, err)
		}
	}
	stop()
	wg.Wait()
	if floodErrs.Load() > 0 {
		t.Errorf("flood got %d errors or unexpected replies", floodErrs.Load())
	}
	if store.victims.Load() != 20 {
		t.Fatalf("victim reached the store %d times, want 20", store.victims.Load())
	}
	if ahead := store.maxAhead.Load(); ahead > bound {
		t.Errorf("victim waited behind %d of the flood's bucket operations, want at most %d", ahead, bound)
	}
	// A refusal answered after the flood's cancel reaches its client as
	// Canceled: the counter may exceed what the clients saw.
	if counted := counterValue(t, h.reg, "quota_regional_caller_limited_total"); refused.Load() == 0 || counted < float64(refused.Load()) {
		t.Errorf("flood refused %d times, counted %v", refused.Load(), counted)
	}
}

// TestInflightBound: the in-flight bound refuses beyond max per caller,
// callers are apart, and a caller with nothing in flight leaves the map
// (it is bounded by the requests in flight).
func TestInflightBound(t *testing.T) {
	l := newInflight(10)
	a, b := callerKey{id: "token:a"}, callerKey{id: "token:b"}
	if !l.acquire(a, 6) || !l.acquire(a, 4) || l.acquire(a, 1) {
		t.Fatal("a: want 6 and 4 taken, then 1 refused")
	}
	if !l.acquire(b, 10) || l.acquire(b, 1) {
		t.Fatal("b is bounded apart from a")
	}
	l.release(a, 6)
	if !l.acquire(a, 6) {
		t.Fatal("a: released room not reusable")
	}
	l.release(a, 10)
	l.release(b, 10)
	if len(l.ops) != 0 {
		t.Fatalf("callers left in the map: %v", l.ops)
	}
	off := newInflight(0)
	if !off.acquire(a, 1<<20) {
		t.Fatal("bound off refused")
	}
	off.release(a, 1<<20)
}
