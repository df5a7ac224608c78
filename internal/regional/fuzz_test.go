package regional

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/internal/policy"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

func fuzzNode(f *testing.F, files map[string]string) (*Node, *policy.Set) {
	h := startNode(f, Config{Grants: trusting(f)}, files)
	return h.node, h.node.Policies()
}

// FuzzCheckRequest: any own-API request is either rejected with a gRPC
// status or becomes items whose keys and requests the store accepts; it
// is then decided (never an error, remaining within the limit), replayed
// with its idempotency key (the same decision, marked replayed), and the
// key presented with a different request is InvalidArgument.
func FuzzCheckRequest(f *testing.F) {
	n, set := fuzzNode(f, map[string]string{"own.yaml": ownConfig})
	adm := &admission{n: n}
	f.Add("acme", false, "small", "big", int64(1), "", false)
	f.Add("raw key ☃", true, "keyed", "", int64(2), "idem", false)
	f.Add("", false, "small", "small", int64(-1), "", true)
	f.Add("x", false, "nope", "", int64(1<<62), "", false)
	f.Fuzz(func(t *testing.T, subject string, hash bool, p1, p2 string, cost int64, idem string, peek bool) {
		req := &quotav1.CheckRequest{Subject: subject, HashSubject: hash, Cost: cost, IdempotencyKey: idem, Peek: peek}
		for _, p := range []string{p1, p2} {
			if p != "" {
				req.Policies = append(req.Policies, p)
			}
		}
		shares := n.beginShares()
		defer shares.end()
		c, err := n.prepareCheck(set, req, &shares, n.access.Load().anonymous)
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				t.Fatalf("error without a status: %v", err)
			}
			return
		}
		for _, it := range c.items {
			if it.unlimited {
				continue
			}
			if err := it.req.Validate(); err != nil && it.req.Share > 0 {
				t.Fatalf("accepted request the store rejects: %v", err)
			}
		}
		ctx := context.Background()
		r, err := adm.Check(ctx, req)
		if err != nil {
			// The key may have been used by an earlier input with another
			// request: that, and only that, is refused here.
			if status.Code(err) != codes.InvalidArgument || idem == "" {
				t.Fatalf("validated request failed to decide: %v", err)
			}
			return
		}
		if r.Limit > 0 && r.Remaining > r.Limit {
			t.Fatalf("remaining %d above the limit %d", r.Remaining, r.Limit)
		}
		if idem == "" {
			return
		}
		again, err := adm.Check(ctx, req)
		if err != nil || !again.Replayed || again.Allowed != r.Allowed {
			t.Fatalf("replay of %v: %v, %v; want the same decision, replayed", r, again, err)
		}
		other := proto.Clone(req).(*quotav1.CheckRequest)
		other.Peek = !req.Peek
		if _, err := adm.Check(ctx, other); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("key replayed for a request with peek=%v: %v, want InvalidArgument", other.Peek, err)
		}
	})
}

// FuzzEnvoyRequest: any Envoy request is either refused by prepareEnvoy
// with a status or maps every descriptor to one status slot with valid
// bucket requests; and ShouldRateLimit answers every request without an
// error (Envoy would admit on one), OVER_LIMIT with a reason for those
// prepareEnvoy refuses.
func FuzzEnvoyRequest(f *testing.F) {
	n, set := fuzzNode(f, map[string]string{"sem.yaml": semanticsConfig})
	api := &rls{n: n}
	f.Add("sem", "k", "a", "u", "x", uint32(0), uint64(0), uint32(0), int32(0), false)
	f.Add("sem", "tier", "gold", "cid", "y", uint32(3), uint64(2), uint32(5), int32(2), false)
	f.Add("", "", "", "", "", uint32(0), uint64(1<<60), uint32(0), int32(9), true)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint32, dhits uint64, rpu uint32, unit int32, neg bool) {
		d1 := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k1, Value: v1}}}
		d2 := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k1, Value: v1}, {Key: k2, Value: v2}},
			IsNegativeHits: neg}
		if dhits > 0 {
			d2.HitsAddend = wrapperspb.UInt64(dhits)
		}
		if rpu > 0 {
			d1.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit(unit)}
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*rlcommon.RateLimitDescriptor{d1, d2}}
		shares := n.beginShares()
		ec, err := n.prepareEnvoy(set, req, &shares, n.access.Load().anonymous, n.cfg.Clock.Now())
		shares.end()
		resp, rerr := api.ShouldRateLimit(context.Background(), req)
		if rerr != nil {
			t.Fatalf("ShouldRateLimit error %v: Envoy admits on an error", rerr)
		}
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				t.Fatalf("error without a status: %v", err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.ResponseHeadersToAdd) == 0 || resp.ResponseHeadersToAdd[0].Key != RejectedHeader {
				t.Fatalf("refused request answered %v %v, want OVER_LIMIT with %s", resp.OverallCode, resp.ResponseHeadersToAdd, RejectedHeader)
			}
			return
		}
		if len(ec.slot) != 2 {
			t.Fatalf("%d slots for 2 descriptors", len(ec.slot))
		}
		for _, it := range append(ec.items, ec.refunds...) {
			if it.unlimited || it.req.Cost > it.req.Limits.Capacity {
				continue
			}
			if err := it.req.Validate(); err != nil {
				t.Fatalf("accepted request the store rejects: %v", err)
			}
		}
		// Decided (and refunded, for negative hits): no descriptor may
		// report more remaining than its limit, before or after a refund.
		for i := 0; i < 2; i++ {
			for j, st := range resp.Statuses {
				if l := st.GetCurrentLimit(); l != nil && st.LimitRemaining > l.RequestsPerUnit {
					t.Fatalf("descriptor %d: remaining %d above the limit %d", j, st.LimitRemaining, l.RequestsPerUnit)
				}
			}
			if resp, rerr = api.ShouldRateLimit(context.Background(), req); rerr != nil {
				t.Fatalf("ShouldRateLimit error %v on a repeated request", rerr)
			}
		}
	})
}
