package regional

import (
	"math"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/internal/clock"
)

const semanticsConfig = `
domain: sem
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: u
    rate_limit: {unlimited: true}
  - key: sh
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: cid
    rate_limit: {name: per_client, unit: minute, requests_per_unit: 2}
  - key: tier
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [{name: per_client}]
`

// want is one expected descriptor status: code, requests_per_unit (0: no
// current_limit) and limit_remaining.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	rpu       uint32
	remaining uint32
}

var (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestEnvoySemantics(t *testing.T) {
	type step struct {
		req     *rlsv3.RateLimitRequest
		overall rlsv3.RateLimitResponse_Code
		want    []want
	}
	r := func(hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "sem", HitsAddend: hits, Descriptors: ds}
	}
	withHits := func(d *rlcommon.RateLimitDescriptor, h uint64) *rlcommon.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(h)
		return d
	}
	withLimit := func(d *rlcommon.RateLimitDescriptor, rpu uint32, u typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: u}
		return d
	}
	refund := func(d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
		d.IsNegativeHits = true
		return d
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"hits_addend 0 means 1, then over limit", []step{
			{r(0, desc("k", "a")), ok, []want{{ok, 3, 2}}},
			{r(0, desc("k", "a")), ok, []want{{ok, 3, 1}}},
			{r(0, desc("k", "a")), ok, []want{{ok, 3, 0}}},
			{r(0, desc("k", "a")), over, []want{{over, 3, 0}}},
		}},
		{"request hits_addend", []step{
			{r(2, desc("k", "b")), ok, []want{{ok, 3, 1}}},
			{r(2, desc("k", "b")), over, []want{{over, 3, 1}}},
		}},
		{"descriptor hits_addend wins", []step{
			{r(1, withHits(desc("k", "c"), 3)), ok, []want{{ok, 3, 0}}},
		}},
		{"cost above the limit is over limit", []step{
			{r(4, desc("k", "c2")), over, []want{{over, 3, 0}}},
		}},
		{"statuses in descriptor order", []step{
			{r(1, desc("k", "d"), desc("nomatch", "x"), desc("u", "any")), ok,
				[]want{{ok, 3, 2}, {ok, 0, 0}, {ok, 0, math.MaxUint32}}},
		}},
		{"shadow mode counts but answers OK", []step{
			{r(1, desc("sh", "a")), ok, []want{{ok, 1, 0}}},
			{r(1, desc("sh", "a")), ok, []want{{ok, 1, 0}}},
		}},
		{"limit override", []step{
			{r(1, withLimit(desc("k", "e"), 1, typev3.RateLimitUnit_SECOND)), ok, []want{{ok, 1, 0}}},
			{r(1, withLimit(desc("k", "e"), 1, typev3.RateLimitUnit_SECOND)), over, []want{{over, 1, 0}}},
			{r(1, desc("k", "e")), ok, []want{{ok, 3, 2}}}, // the configured bucket is apart
		}},
		{"replaced limit is not applied", []step{
			{r(1, desc("cid", "x"), desc("tier", "gold")), ok, []want{{ok, 0, 0}, {ok, 100, 99}}},
			{r(1, desc("cid", "x"), desc("tier", "gold")), ok, []want{{ok, 0, 0}, {ok, 100, 98}}},
			{r(1, desc("cid", "x"), desc("tier", "gold")), ok, []want{{ok, 0, 0}, {ok, 100, 97}}},
			{r(1, desc("cid", "x")), ok, []want{{ok, 2, 1}}},
		}},
		{"over limit charges no other descriptor", []step{
			{r(3, desc("k", "f")), ok, []want{{ok, 3, 0}}},
			{r(1, desc("k", "f"), desc("k", "g")), over, []want{{over, 3, 0}, {ok, 3, 3}}},
			{r(1, desc("k", "g")), ok, []want{{ok, 3, 2}}},
		}},
		{"unknown domain has no limits", []step{
			{&rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}}, ok, []want{{ok, 0, 0}}},
		}},
		{"negative hits refund", []step{
			{r(3, desc("k", "h")), ok, []want{{ok, 3, 0}}},
			{r(1, refund(desc("k", "h"))), ok, []want{{ok, 3, 1}}},
			{r(1, desc("k", "h")), ok, []want{{ok, 3, 0}}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 5, 0, time.UTC))
			h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk)}, map[string]string{"sem.yaml": semanticsConfig})
			for i, s := range tt.steps {
				resp, err := h.rls.ShouldRateLimit(ctxT(t), s.req)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if resp.OverallCode != s.overall || len(resp.Statuses) != len(s.want) {
					t.Fatalf("step %d: overall %v with %d statuses, want %v with %d", i, resp.OverallCode, len(resp.Statuses), s.overall, len(s.want))
				}
				for j, w := range s.want {
					st := resp.Statuses[j]
					if st.Code != w.code || st.CurrentLimit.GetRequestsPerUnit() != w.rpu || st.LimitRemaining != w.remaining {
						t.Fatalf("step %d status %d: %v rpu %d remaining %d; want %v rpu %d remaining %d",
							i, j, st.Code, st.CurrentLimit.GetRequestsPerUnit(), st.LimitRemaining, w.code, w.rpu, w.remaining)
					}
					if st.Code == over && st.DurationUntilReset.AsDuration() <= 0 {
						t.Fatalf("step %d status %d: over limit without duration_until_reset", i, j)
					}
				}
			}
		})
	}
}

func TestEnvoyHeaders(t *testing.T) {
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 5, 0, time.UTC))
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Headers: HeadersDraft}, map[string]string{"sem.yaml": semanticsConfig})
	resp, err := h.rls.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "sem",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("tier", "gold"), desc("k", "z")}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		got[hv.Key] = hv.Value
	}
	want := map[string]string{"RateLimit-Limit": "3", "RateLimit-Remaining": "2", "RateLimit-Reset": "55"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

func TestEnvoyBadInput(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{"sem.yaml": semanticsConfig})
	long := make([]byte, MaxEntryLen+1)
	for i := range long {
		long[i] = 'a'
	}
	many := make([]*rlcommon.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("k", "a")
	}
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}}},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "sem"}},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: many}},
		{"empty descriptor", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{{}}}},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc("", "a")}}},
		{"oversize value", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", string(long))}}},
		{"oversize hits", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, HitsAddend: wrapperspb.UInt64(1 << 60)}}}},
		{"zero override", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_SECOND}}}}},
		{"unknown override unit", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.rls.ShouldRateLimit(ctxT(t), tt.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
		})
	}
	if n := h.store.calls.Load(); n != 0 {
		t.Fatalf("bad input reached the store %d times", n)
	}
}
