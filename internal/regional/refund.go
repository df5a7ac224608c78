package regional

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quotacoord/quota/internal/grants"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// Refund implements quotav1.AdmissionServer: it gives back the cost of
// each charge, each on its own and never above its bucket's capacity,
// as the Envoy API's is_negative_hits descriptors are given back (refund).
// A refund refills a bucket, so it needs the refund grant for every
// policy named (the default grants give check only): one charge the
// caller may not refund fails the whole call with PermissionDenied before
// anything is given back, as does any bad charge with InvalidArgument.
// The store is skipped while the breaker is open; such a charge, and one
// of an unlimited policy or a zero share, is answered refunded = false.
// Refunds record no demand: the check that charged them did.
func (a *admission) Refund(ctx context.Context, req *quotav1.RefundRequest) (*quotav1.RefundResponse, error) {
	return runCharges(ctx, a.n, req.GetCharges(), grants.Refund, a.n.refundCharges,
		func(*check) (*quotav1.RefundResponse, error) {
			return nil, status.Errorf(codes.ResourceExhausted, "caller has too many bucket operations in flight; retry the refund after %v", a.n.cfg.StoreTimeout)
		})
}

// refundCharges gives back the cost of c's items (validated charges).
func (n *Node) refundCharges(ctx context.Context, c *check) (*quotav1.RefundResponse, error) {
	ctx, span := n.startSpan(ctx, "regional.Refund")
	defer span.End()
	now := n.cfg.Clock.Now()
	for i := range c.items {
		if it := &c.items[i]; it.refused || it.unlimited {
			// No bucket to give back to: the subject holds none (the
			// store refused to grow) or the policy keeps none.
			it.req.Share = 0
		}
	}
	decs := n.refund(ctx, now, c.items)
	resp := &quotav1.RefundResponse{Refunds: make([]*quotav1.RefundDecision, len(c.items))}
	for i := range c.items {
		it := &c.items[i]
		r := &quotav1.RefundDecision{Policy: it.label, Limit: floorInt(it.limit())}
		if d := decs[i]; d != nil {
			r.Refunded = true
			r.Limit, r.Remaining = floorInt(d.Limit), floorInt(d.Remaining)
			r.ResetAfter = durationpb.New(d.ResetAfter)
			r.DecidedAt = decidedAt(*d, now)
		} else {
			r.ResetAfter = durationpb.New(0)
			r.DecidedAt = timestamppb.New(now)
		}
		resp.Refunds[i] = r
	}
	return resp, nil
}
