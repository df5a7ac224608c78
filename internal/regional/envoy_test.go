package regional

import (
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
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
			h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Grants: trusting(t)}, map[string]string{"sem.yaml": semanticsConfig})
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

// TestEnvoyBadInputIsOverLimit is an attack: Envoy admits a request whose
// rate limit call fails (failure_mode_deny: false is its default), so
// input that makes the node answer an error lifts the limit. A request
// the node cannot decide is answered OVER_LIMIT with the reason in
// x-quota-rejected, never with an error, and charges nothing; a
// hits_addend beyond MaxCost is decided as any cost above the capacity
// (OVER_LIMIT, no store call).
func TestEnvoyBadInputIsOverLimit(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{"sem.yaml": semanticsConfig})
	many := make([]*rlcommon.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("k", "a")
	}
	deep := make([]string, 0, 2*(policy.MaxEntries+1))
	for i := 0; i <= policy.MaxEntries; i++ {
		deep = append(deep, "k", "a")
	}
	tests := []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		decided bool // denied as a decision, not rejected as bad input
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}}, false},
		{"oversize domain", &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", policy.MaxDomainBytes+1), Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}}, false},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "sem"}, false},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: many}, false},
		{"empty descriptor", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{{}}}, false},
		{"too many entries", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc(deep...)}}, false},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc("", "a")}}, false},
		{"oversize key", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc(strings.Repeat("k", policy.MaxEntryBytes+1), "a")}}, false},
		{"oversize hits", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, HitsAddend: wrapperspb.UInt64(1 << 60)}}}, true},
		{"largest hits", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, HitsAddend: wrapperspb.UInt64(math.MaxUint64)}}}, true},
		{"zero override", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_SECOND}}}}, false},
		{"unknown override unit", &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: desc("k", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := h.rls.ShouldRateLimit(ctxT(t), tt.req)
			if err != nil {
				t.Fatalf("err = %v: Envoy with failure_mode_deny false admits this request", err)
			}
			if resp.OverallCode != over {
				t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
			}
			reason := ""
			for _, hv := range resp.ResponseHeadersToAdd {
				if hv.Key == RejectedHeader {
					reason = hv.Value
				}
			}
			if (reason == "") != tt.decided {
				t.Fatalf("%s reason %q; want one only for input that cannot be decided", RejectedHeader, reason)
			}
			for i, st := range resp.Statuses {
				if st.Code != over {
					t.Fatalf("status %d is %v, want OVER_LIMIT", i, st.Code)
				}
			}
		})
	}
	if n := h.store.calls.Load(); n != 0 {
		t.Fatalf("bad input reached the store %d times", n)
	}
	if n := counterValue(t, h.reg, "quota_regional_rejected_requests_total"); n != float64(len(tests)-2) {
		t.Fatalf("rejected requests counted %v, want %d", n, len(tests)-2)
	}
}

// TestEnvoyOversizeValuesHashed is an attack: a descriptor value longer
// than MaxEntryBytes (a 1 KiB x-tenant-id) used to be InvalidArgument,
// which Envoy turns into admission. It is hashed like any other value:
// each long value is its own bucket and is limited, and no raw byte of it
// reaches a bucket key.
func TestEnvoyOversizeValuesHashed(t *testing.T) {
	clk := clock.NewManual(t0)
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), EnvoyPlainKeys: []string{"k"}}, map[string]string{"sem.yaml": semanticsConfig})
	for _, n := range []int{policy.MaxEntryBytes + 1, 64 << 10} {
		long := strings.Repeat("A", n)
		for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, ok, over} {
			resp, err := h.rls.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", long)}})
			if err != nil || resp.OverallCode != want {
				t.Fatalf("%d-byte value, request %d: %v, %v; want %v", n, i, resp.GetOverallCode(), err, want)
			}
		}
	}
	keys := h.store.seen()
	if len(keys) == 0 {
		t.Fatal("long values never reached the store")
	}
	distinct := map[bucket.Key]bool{}
	for _, k := range keys {
		distinct[k] = true
		if strings.Contains(k.Subject(), "AAAA") {
			t.Fatalf("raw value in bucket key %s", k)
		}
	}
	if len(distinct) != 2 {
		t.Fatalf("%d buckets for two distinct long values", len(distinct))
	}
}
