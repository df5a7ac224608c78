package regional

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/demand"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"

	"github.com/hashicorp/go-hclog"
)

// dimensionPolicies: one request is charged to an API key (5), a client
// address (2) and the whole API (100), each under its own policy.
var dimensionPolicies = map[string]string{"dims.yaml": `policies:
  - {name: per_key, capacity: 5, rate: 5/hour, failure_mode: closed}
  - {name: per_ip, capacity: 2, rate: 2/hour, failure_mode: closed}
  - {name: global, capacity: 100, rate: 100/hour, failure_mode: closed}
`}

// apart returns two subjects with prefixes a and b whose buckets under
// policies pa and pb live in different Redis groups (hash tags, so
// different Cluster slots).
func apart(t *testing.T, s *bucket.Redis, pa, a, pb, b string) (string, string) {
	t.Helper()
	tag := func(policy, subject string) string {
		k, err := bucket.NewKey(policy, 1, subject)
		if err != nil {
			t.Fatal(err)
		}
		key, _ := s.Location(k, bucket.Limits{})
		return key[strings.Index(key, "{"):strings.Index(key, "}")]
	}
	u := strings.ReplaceAll(redistest.Unique(t), "-", "_")
	for i := 0; ; i++ {
		sa, sb := fmt.Sprintf("%s_%s_%d", a, u, i), fmt.Sprintf("%s_%s", b, u)
		if tag(pa, sa) != tag(pb, sb) {
			return sa, sb
		}
	}
}

// TestCheckAllPartialDenialAdmitsNothing: a request charged to an API
// key, an address and the whole API is admitted twice; the third is
// denied by the address alone and charges neither the key nor the whole
// API, whose buckets lie in other Redis slots. On a single server the
// charges go in one atomic script call; through a Ring (what a cluster
// does: one call per slot) the slots that admitted are refunded.
func TestCheckAllPartialDenialAdmitsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		conn func(t *testing.T) bucket.RedisConn
	}{
		{"one server", func(t *testing.T) bucket.RedisConn { return redistest.Client(t) }},
		{"per slot", func(t *testing.T) bucket.RedisConn {
			r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": redistest.Addr(t)}})
			t.Cleanup(func() { _ = r.Close() })
			return r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := redisStore(t, tc.conn(t))
			h := startNode(t, Config{Store: store, StoreTimeout: 10 * time.Second, Grants: trusting(t)}, dimensionPolicies)
			ctx := ctxT(t)
			key, ip := apart(t, store.(*bucket.Redis), "per_key", "key", "per_ip", "ip")
			global := "all_" + strings.ReplaceAll(redistest.Unique(t), "-", "_")
			req := &quotav1.CheckAllRequest{Charges: []*quotav1.Charge{
				{Policy: "per_key", Subject: key},
				{Policy: "per_ip", Subject: ip},
				{Policy: "global", Subject: global},
			}}
			for i, want := range []bool{true, true, false, false} {
				before := time.Now()
				r, err := h.adm.CheckAll(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed != want || r.Degraded != "" {
					t.Fatalf("check %d: allowed %v degraded %q, want %v: %+v", i, r.Allowed, r.Degraded, want, r)
				}
				if len(r.Policies) != 3 {
					t.Fatalf("check %d: %d policy decisions, want one per charge", i, len(r.Policies))
				}
				// Redis TIME, within this machine's wall clock.
				at := r.DecidedAt.AsTime()
				if at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
					t.Errorf("check %d: decided_at %v, not near %v", i, at, before)
				}
				if !want && (r.DecidedBy != "per_ip" || r.DecidedIndex != 1 || r.RetryAfter.AsDuration() <= 0) {
					t.Errorf("check %d: decided by %q (index %d), retry %v; want per_ip (1) with a wait", i, r.DecidedBy, r.DecidedIndex, r.RetryAfter.AsDuration())
				}
			}
			// The denials charged nothing: the key holds 5-2, the API 100-2.
			for _, tt := range []struct {
				policy, subject string
				remaining       int64
			}{{"per_key", key, 3}, {"global", global, 98}, {"per_ip", ip, 0}} {
				r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: tt.subject, Policies: []string{tt.policy}, Peek: true})
				if err != nil {
					t.Fatal(err)
				}
				if r.Remaining != tt.remaining {
					t.Errorf("%s after two admissions and two denials: %d remaining, want %d", tt.policy, r.Remaining, tt.remaining)
				}
			}
		})
	}
}

// TestCheckAllRacersAcrossSlots: 500 concurrent CheckAll calls charge an
// API key (1000), an address (10) and the whole API (1000) whose buckets
// lie in different slots, one script call per slot (a Ring). Exactly 10
// are admitted, and once the denied calls' compensating refunds are done
// the key and the whole API hold exactly 1000 - 10: no denial kept a
// token anywhere.
func TestCheckAllRacersAcrossSlots(t *testing.T) {
	r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": redistest.Addr(t)}})
	t.Cleanup(func() { _ = r.Close() })
	store := redisStore(t, r)
	files := map[string]string{"race.yaml": `policies:
  - {name: per_key, capacity: 1000, rate: 1000/hour, failure_mode: closed}
  - {name: per_ip, capacity: 10, rate: 10/hour, failure_mode: closed}
  - {name: global, capacity: 1000, rate: 1000/hour, failure_mode: closed}
`}
	h := startNode(t, Config{Store: store, StoreTimeout: 10 * time.Second, Grants: trusting(t), CallerMaxInflight: 10_000}, files)
	ctx := ctxT(t)
	key, ip := apart(t, store.(*bucket.Redis), "per_key", "key", "per_ip", "ip")
	global := "all_" + strings.ReplaceAll(redistest.Unique(t), "-", "_")
	req := &quotav1.CheckAllRequest{Charges: []*quotav1.Charge{
		{Policy: "per_key", Subject: key}, {Policy: "per_ip", Subject: ip}, {Policy: "global", Subject: global}}}
	got := concurrently(t, func() (bool, error) {
		r, err := h.adm.CheckAll(ctx, req)
		if err != nil {
			return false, err
		}
		if r.Degraded != "" {
			return false, fmt.Errorf("degraded %q", r.Degraded)
		}
		return r.Allowed, nil
	})
	if got != 10 {
		t.Fatalf("%d of 500 admitted, want the address's 10", got)
	}
	for _, tt := range []struct{ policy, subject string }{{"per_key", key}, {"global", global}} {
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: tt.subject, Policies: []string{tt.policy}, Peek: true})
		if err != nil {
			t.Fatal(err)
		}
		if r.Remaining != 990 {
			t.Errorf("%s holds %d after 10 admissions, want 990", tt.policy, r.Remaining)
		}
	}
}

// TestCheckAllBadInput: every bound of CheckAll is InvalidArgument (an
// unknown policy NotFound) with a message naming the charge, and charges
// nothing, even for the valid charges before the bad one.
func TestCheckAllBadInput(t *testing.T) {
	h := startNode(t, Config{Store: redisStore(t, redistest.Client(t)), StoreTimeout: 10 * time.Second}, dimensionPolicies)
	ctx := ctxT(t)
	ok := &quotav1.Charge{Policy: "per_key", Subject: "bad_input_" + strings.ReplaceAll(redistest.Unique(t), "-", "_")}
	many := make([]*quotav1.Charge, MaxCharges+1)
	for i := range many {
		many[i] = ok
	}
	for _, tt := range []struct {
		name    string
		charges []*quotav1.Charge
		code    codes.Code
		msg     string
	}{
		{"no charges", nil, codes.InvalidArgument, "0 charges"},
		{"too many", many, codes.InvalidArgument, "17 charges"},
		{"empty policy", []*quotav1.Charge{ok, {Subject: "s"}}, codes.InvalidArgument, "charge 1: policy name"},
		{"empty subject", []*quotav1.Charge{ok, {Policy: "per_ip"}}, codes.InvalidArgument, "charge 1: subject has 0 bytes"},
		{"long subject", []*quotav1.Charge{ok, {Policy: "per_ip", Subject: strings.Repeat("a", MaxRawSubjectLen+1), HashSubject: true}}, codes.InvalidArgument, "charge 1: subject has 1025"},
		{"raw subject unhashed", []*quotav1.Charge{ok, {Policy: "per_ip", Subject: "192.0.2.1"}}, codes.InvalidArgument, "set hash_subject"},
		{"negative cost", []*quotav1.Charge{ok, {Policy: "per_ip", Subject: "s", Cost: -1}}, codes.InvalidArgument, "charge 1: cost -1 is negative"},
		{"cost beyond MaxCost", []*quotav1.Charge{ok, {Policy: "per_ip", Subject: "s", Cost: MaxCost + 1}}, codes.InvalidArgument, "exceeds"},
		{"cost beyond capacity", []*quotav1.Charge{ok, {Policy: "per_ip", Subject: "s", Cost: 3}}, codes.InvalidArgument, `capacity 2 of policy "per_ip"`},
		{"unknown policy", []*quotav1.Charge{ok, {Policy: "nope", Subject: "s"}}, codes.NotFound, `charge 1: unknown policy "nope"`},
	} {
		_, err := h.adm.CheckAll(ctx, &quotav1.CheckAllRequest{Charges: tt.charges})
		if st := status.Convert(err); st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
			t.Errorf("%s: %v, want %v containing %q", tt.name, err, tt.code, tt.msg)
		}
	}
	if n := h.store.calls.Load(); n != 0 {
		t.Fatalf("bad requests made %d store calls, want none", n)
	}
}

// TestCheckAllDemandPerCharge: demand is recorded for each charge under
// its own policy, admitted or offered, with its own cost.
func TestCheckAllDemandPerCharge(t *testing.T) {
	clk := clock.NewManual(t0)
	rec, err := demand.New(demand.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Demand: rec}, dimensionPolicies)
	ctx := ctxT(t)
	req := &quotav1.CheckAllRequest{Charges: []*quotav1.Charge{
		{Policy: "per_key", Subject: "k", Cost: 2},
		{Policy: "per_ip", Subject: "a", Cost: 1},
		{Policy: "global", Subject: "all", Cost: 2},
	}}
	for range 3 { // per_ip admits two, the third is denied
		if _, err := h.adm.CheckAll(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	rep := rec.Snapshot(t0.Add(time.Second))
	for _, tt := range []struct {
		policy            string
		offered, admitted float64
	}{{"per_key", 6, 4}, {"per_ip", 3, 2}, {"global", 6, 4}} {
		pd := rep[tt.policy]
		if pd.Offered != tt.offered || pd.Admitted != tt.admitted {
			t.Errorf("%s: offered %v admitted %v, want %v and %v", tt.policy, pd.Offered, pd.Admitted, tt.offered, tt.admitted)
		}
	}
}

// TestDecidedAtIsTheStoresInstant: with the in-process store the
// decision's instant is the store's clock, on Check, CheckAll and Refund
// and on every policy decision; the sampled decision log carries each
// policy's cost.
func TestDecidedAtIsTheStoresInstant(t *testing.T) {
	clk := clock.NewManual(t0)
	out := &logbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info})
	g, err := grants.Parse("g", []byte("default: [{actions: [check, refund], policies: ['*']}]"))
	if err != nil {
		t.Fatal(err)
	}
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Logger: log, DecisionLogEvery: 1, Grants: g}, dimensionPolicies)
	ctx := ctxT(t)
	clk.Advance(1500 * time.Microsecond)
	r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "s", Policies: []string{"per_key", "global"}, Cost: 4})
	if err != nil {
		t.Fatal(err)
	}
	want := clk.Now()
	if !r.DecidedAt.AsTime().Equal(want) || !r.Policies[0].DecidedAt.AsTime().Equal(want) || !r.Policies[1].DecidedAt.AsTime().Equal(want) {
		t.Errorf("Check decided at %v (policies %v, %v), want %v", r.DecidedAt.AsTime(), r.Policies[0].DecidedAt.AsTime(), r.Policies[1].DecidedAt.AsTime(), want)
	}
	if r.DecidedBy != "per_key" || r.DecidedIndex != 0 {
		t.Errorf("decided by %q (%d), want per_key (0), the least remaining", r.DecidedBy, r.DecidedIndex)
	}
	if !strings.Contains(out.String(), "costs=[4, 4]") {
		t.Errorf("decision log without the costs:\n%s", out.String())
	}
	clk.Advance(time.Second)
	ra, err := h.adm.CheckAll(ctx, &quotav1.CheckAllRequest{Charges: []*quotav1.Charge{{Policy: "per_ip", Subject: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !ra.DecidedAt.AsTime().Equal(clk.Now()) {
		t.Errorf("CheckAll decided at %v, want %v", ra.DecidedAt.AsTime(), clk.Now())
	}
	clk.Advance(time.Second)
	rf, err := h.adm.Refund(ctx, &quotav1.RefundRequest{Charges: []*quotav1.Charge{{Policy: "per_key", Subject: "s", Cost: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := rf.Refunds[0]; !d.Refunded || d.Remaining != 5 || !d.DecidedAt.AsTime().Equal(clk.Now()) {
		t.Errorf("refund: %+v, want refunded to 5 at %v", d, clk.Now())
	}
}
