package regional

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// drain charges policy for subject until it denies and returns how many
// it admitted.
func drain(t *testing.T, adm quotav1.AdmissionClient, policy, subject string) int {
	t.Helper()
	for n := 0; ; n++ {
		r, err := adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: subject, Policies: []string{policy}})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			return n
		}
		if n > 100 {
			t.Fatalf("%s never denied", policy)
		}
	}
}

// TestRefundWithoutGrantRefundsNothing is the attack on the own API's
// Refund: a caller with the default grants (check only) drains its
// bucket, then refunds to fill it again. Every refund is
// PermissionDenied and counted, and the bucket stays empty: the caller
// gets no more than the policy's capacity, on real Redis.
func TestRefundWithoutGrantRefundsNothing(t *testing.T) {
	h := startNode(t, Config{Store: redisStore(t, redistest.Client(t)), StoreTimeout: 10 * time.Second}, authzPolicies)
	ctx := ctxT(t)
	victim := "refund_" + strings.ReplaceAll(redistest.Unique(t), "-", "_")
	if n := drain(t, h.adm, "small", victim); n != 3 {
		t.Fatalf("admitted %d before the first denial, want the capacity 3", n)
	}
	for range 5 {
		_, err := h.adm.Refund(ctx, &quotav1.RefundRequest{Charges: []*quotav1.Charge{{Policy: "small", Subject: victim, Cost: 3}}})
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), `may not refund policy "small"`) {
			t.Fatalf("refund without the grant: %v, want PermissionDenied", err)
		}
		if n := drain(t, h.adm, "small", victim); n != 0 {
			t.Fatalf("after a refused refund %d more admitted, want 0", n)
		}
	}
	if got := counterValue(t, h.reg, "quota_regional_forbidden_actions_total"); got != 5 {
		t.Errorf("forbidden actions counted %v, want 5", got)
	}
}

// TestRefundGrantedPerPolicy: with refund granted on one policy only, a
// refund of that policy fills its bucket again (never above capacity), and
// a refund naming it beside a policy without the grant is refused whole:
// nothing is given back to either.
func TestRefundGrantedPerPolicy(t *testing.T) {
	g, err := grants.Parse("g", []byte("default: [{actions: [check], policies: ['*']}, {actions: [refund], policies: [small]}]"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"own.yaml": "policies:\n  - {name: small, capacity: 3, rate: 3/hour}\n  - {name: other, capacity: 3, rate: 3/hour}\n"}
	h := startNode(t, Config{Store: redisStore(t, redistest.Client(t)), StoreTimeout: 10 * time.Second, Grants: g}, files)
	ctx := ctxT(t)
	subject := "granted_" + strings.ReplaceAll(redistest.Unique(t), "-", "_")
	drain(t, h.adm, "small", subject)
	drain(t, h.adm, "other", subject)

	_, err = h.adm.Refund(ctx, &quotav1.RefundRequest{Charges: []*quotav1.Charge{
		{Policy: "small", Subject: subject, Cost: 2}, {Policy: "other", Subject: subject, Cost: 2}}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refund of a granted and an ungranted policy: %v, want PermissionDenied", err)
	}
	if n := drain(t, h.adm, "small", subject); n != 0 {
		t.Fatalf("the refused refund gave %d back to the granted policy, want 0", n)
	}

	r, err := h.adm.Refund(ctx, &quotav1.RefundRequest{Charges: []*quotav1.Charge{{Policy: "small", Subject: subject, Cost: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := r.Refunds[0]; !d.Refunded || d.Policy != "small" || d.Remaining != 2 || d.Limit != 3 || d.DecidedAt == nil {
		t.Fatalf("granted refund: %+v, want 2 of 3 back", d)
	}
	if n := drain(t, h.adm, "small", subject); n != 2 {
		t.Fatalf("after refunding 2, %d admitted", n)
	}
	// Refunds never fill above capacity: 3 back, twice, leaves 3.
	for range 2 {
		if _, err := h.adm.Refund(ctx, &quotav1.RefundRequest{Charges: []*quotav1.Charge{{Policy: "small", Subject: subject, Cost: 3}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := drain(t, h.adm, "small", subject); n != 3 {
		t.Fatalf("after over-refunding, %d admitted, want the capacity 3", n)
	}
	// Bounds apply to refunds as to checks.
	_, err = h.adm.Refund(ctx, &quotav1.RefundRequest{Charges: []*quotav1.Charge{{Policy: "small", Subject: subject, Cost: 4}}})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "capacity 3") {
		t.Fatalf("refund above capacity: %v, want InvalidArgument", err)
	}
}
