package regional

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/clock"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

const ownConfig = `
policies:
  - name: small
    capacity: 3
    rate: 3/minute
    failure_mode: closed
  - name: big
    capacity: 100
    rate: 100/minute
    failure_mode: open
  - name: keyed
    subject: api_key
    capacity: 2
    rate: 2/minute
`

func TestCheckBadInput(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{"own.yaml": ownConfig})
	long := strings.Repeat("a", 97)
	many := make([]string, MaxPolicies+1)
	for i := range many {
		many[i] = "p" + string(rune('a'+i))
	}
	tests := []struct {
		name string
		req  *quotav1.CheckRequest
		code codes.Code
	}{
		{"empty subject", &quotav1.CheckRequest{Policies: []string{"small"}}, codes.InvalidArgument},
		{"oversize subject", &quotav1.CheckRequest{Subject: long, Policies: []string{"small"}}, codes.InvalidArgument},
		{"bad subject byte", &quotav1.CheckRequest{Subject: "a b", Policies: []string{"small"}}, codes.InvalidArgument},
		{"oversize raw subject", &quotav1.CheckRequest{Subject: strings.Repeat("x", MaxRawSubjectLen+1), HashSubject: true, Policies: []string{"small"}}, codes.InvalidArgument},
		{"no policies", &quotav1.CheckRequest{Subject: "s"}, codes.InvalidArgument},
		{"too many policies", &quotav1.CheckRequest{Subject: "s", Policies: many}, codes.InvalidArgument},
		{"policy twice", &quotav1.CheckRequest{Subject: "s", Policies: []string{"small", "small"}}, codes.InvalidArgument},
		{"empty policy name", &quotav1.CheckRequest{Subject: "s", Policies: []string{""}}, codes.InvalidArgument},
		{"negative cost", &quotav1.CheckRequest{Subject: "s", Policies: []string{"small"}, Cost: -1}, codes.InvalidArgument},
		{"cost above capacity", &quotav1.CheckRequest{Subject: "s", Policies: []string{"small"}, Cost: 4}, codes.InvalidArgument},
		{"overflowing cost", &quotav1.CheckRequest{Subject: "s", Policies: []string{"big"}, Cost: 1 << 62}, codes.InvalidArgument},
		{"oversize idempotency key", &quotav1.CheckRequest{Subject: "s", Policies: []string{"small"}, IdempotencyKey: strings.Repeat("k", 129)}, codes.InvalidArgument},
		{"unknown policy", &quotav1.CheckRequest{Subject: "s", Policies: []string{"small", "nope"}}, codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.adm.Check(ctxT(t), tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("err = %v, want %v", err, tt.code)
			}
		})
	}
	// A bad entry fails the whole batch and charges nothing.
	_, err := h.adm.CheckBatch(ctxT(t), &quotav1.CheckBatchRequest{Checks: []*quotav1.CheckRequest{
		{Subject: "batch", Policies: []string{"small"}},
		{Subject: "batch", Policies: []string{"small"}, Cost: -5},
	}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "check 1") {
		t.Fatalf("batch err = %v", err)
	}
	big := make([]*quotav1.CheckRequest, MaxBatch+1)
	if _, err := h.adm.CheckBatch(ctxT(t), &quotav1.CheckBatchRequest{Checks: big}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("oversize batch err = %v", err)
	}
	if n := h.store.calls.Load(); n != 0 {
		t.Fatalf("bad input reached the store %d times", n)
	}
}

func TestUnknownPolicyModes(t *testing.T) {
	for _, tt := range []struct {
		mode    UnknownPolicy
		allowed bool
		by      string
	}{{UnknownDeny, false, "nope"}, {UnknownAllow, true, "big"}} {
		t.Run(string(tt.mode), func(t *testing.T) {
			h := startNode(t, Config{UnknownPolicy: tt.mode}, map[string]string{"own.yaml": ownConfig})
			r, err := h.adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: "s", Policies: []string{"big", "nope"}})
			if err != nil || r.Allowed != tt.allowed || r.DecidedBy != tt.by {
				t.Fatalf("got %v, %v; want allowed %v by %q", r, err, tt.allowed, tt.by)
			}
		})
	}
}

func TestCheckAllOrNothingAndReplies(t *testing.T) {
	clk := clock.NewManual(t0)
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Grants: trusting(t)}, map[string]string{"own.yaml": ownConfig})
	ctx := ctxT(t)
	check := func(req *quotav1.CheckRequest) *quotav1.CheckResponse {
		t.Helper()
		r, err := h.adm.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := check(&quotav1.CheckRequest{Subject: "acme", Policies: []string{"big", "small"}, Cost: 3})
	if !r.Allowed || r.DecidedBy != "small" || r.Remaining != 0 || r.Limit != 3 || len(r.Policies) != 2 || r.Policies[0].Remaining != 97 {
		t.Fatalf("first check %v", r)
	}
	r = check(&quotav1.CheckRequest{Subject: "acme", Policies: []string{"big", "small"}})
	if r.Allowed || r.DecidedBy != "small" || r.RetryAfter.AsDuration() <= 0 {
		t.Fatalf("second check %v", r)
	}
	// "big" was not charged by the denied check.
	r = check(&quotav1.CheckRequest{Subject: "acme", Policies: []string{"big"}, Peek: true})
	if !r.Allowed || r.Remaining != 97 {
		t.Fatalf("peek %v", r)
	}
	// The negative cache denies the same cost without the store.
	before := h.store.calls.Load()
	r = check(&quotav1.CheckRequest{Subject: "acme", Policies: []string{"small"}})
	if r.Allowed || h.store.calls.Load() != before {
		t.Fatalf("negative cache: %v, store calls %d -> %d", r, before, h.store.calls.Load())
	}
	clk.Advance(time.Minute)
	if r = check(&quotav1.CheckRequest{Subject: "acme", Policies: []string{"small"}}); !r.Allowed {
		t.Fatalf("after refill %v", r)
	}
	// Hashed subjects: a raw key never reaches the store as it is.
	r = check(&quotav1.CheckRequest{Subject: "sk_live raw key!", HashSubject: true, Policies: []string{"keyed"}})
	if !r.Allowed {
		t.Fatalf("hashed %v", r)
	}
	for _, k := range h.store.seen() {
		if strings.Contains(k.String(), "raw") {
			t.Fatalf("raw subject in key %s", k)
		}
	}
}

func TestIdempotentReplay(t *testing.T) {
	clk := clock.NewManual(t0)
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Grants: trusting(t)}, map[string]string{"own.yaml": ownConfig})
	req := &quotav1.CheckRequest{Subject: "idem", Policies: []string{"small"}, IdempotencyKey: "order-42"}
	first, err := h.adm.Check(ctxT(t), req)
	if err != nil || !first.Allowed || first.Replayed || first.Remaining != 2 {
		t.Fatalf("first %v %v", first, err)
	}
	for i := 0; i < 3; i++ {
		again, err := h.adm.Check(ctxT(t), req)
		if err != nil || !again.Replayed || again.Remaining != 2 {
			t.Fatalf("retry %d: %v %v", i, again, err)
		}
	}
	other, _ := h.adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: "idem", Policies: []string{"small"}, IdempotencyKey: "order-43"})
	if other.Replayed || other.Remaining != 1 {
		t.Fatalf("other key %v", other)
	}
	clk.Advance(2 * time.Minute)
	late, _ := h.adm.Check(ctxT(t), req)
	if late.Replayed {
		t.Fatal("replayed after the TTL")
	}
}

// TestPolicyHashesRawSubjects: a policy whose subjects are untrusted (api_key,
// ip, email: hash_subject by default) takes a raw identity without the
// request's hash_subject, and only its hash reaches the store; a policy
// with plain subjects still rejects it, alone or beside a hashing one.
func TestPolicyHashesRawSubjects(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{"own.yaml": `policies:
  - {name: per-ip, subject: ip, capacity: 5, rate: 5/second}
  - {name: per-email, subject: email, capacity: 5, rate: 5/second}
  - {name: plain, capacity: 5, rate: 5/second}
`})
	tests := []struct {
		subject  string
		policies []string
		code     codes.Code
	}{
		{"203.0.113.77", []string{"per-ip"}, codes.OK},
		{"2001:db8::1", []string{"per-ip"}, codes.OK},
		{"alice@example.com", []string{"per-email"}, codes.OK},
		{"203.0.113.77", []string{"plain"}, codes.InvalidArgument},
		// One hashing policy hashes the subject for every policy of the check.
		{"203.0.113.78", []string{"plain", "per-ip"}, codes.OK},
		{strings.Repeat("1", MaxRawSubjectLen+1), []string{"per-ip"}, codes.InvalidArgument},
		{"", []string{"per-ip"}, codes.InvalidArgument},
	}
	for _, tt := range tests {
		r, err := h.adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: tt.subject, Policies: tt.policies})
		if status.Code(err) != tt.code {
			t.Fatalf("%q %v: %v, %v; want %v", tt.subject, tt.policies, r, err, tt.code)
		}
		if err == nil && !r.Allowed {
			t.Fatalf("%q %v: denied %v", tt.subject, tt.policies, r)
		}
	}
	for _, k := range h.store.seen() {
		for _, raw := range []string{"203", "2001", "alice", "example"} {
			if strings.Contains(k.String(), raw) {
				t.Fatalf("raw subject %q in key %s", raw, k)
			}
		}
	}
	if len(h.store.seen()) == 0 {
		t.Fatal("no store call: the key check proves nothing")
	}
}

// TestIdempotencyKeyBoundToRequest is an attack: a peek with key K, then a
// real check with key K, must not replay the peek (allowed, never
// charged). A key reused for a different request (policies, cost, peek) is
// InvalidArgument and charges nothing; the same request is still replayed.
func TestIdempotencyKeyBoundToRequest(t *testing.T) {
	clk := clock.NewManual(t0)
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Grants: trusting(t)}, map[string]string{"own.yaml": ownConfig})
	check := func(req *quotav1.CheckRequest) (*quotav1.CheckResponse, error) {
		req.Subject = "idem-attack"
		return h.adm.Check(ctxT(t), req)
	}
	// Drain "small" (capacity 3) so that a charged check would be denied.
	for i := 0; i < 3; i++ {
		if r, err := check(&quotav1.CheckRequest{Policies: []string{"small"}}); err != nil || !r.Allowed {
			t.Fatalf("drain %d: %v %v", i, r, err)
		}
	}
	for _, tc := range []struct {
		name        string
		first, then *quotav1.CheckRequest
	}{
		{"peek then charge", &quotav1.CheckRequest{Policies: []string{"big"}, Peek: true, IdempotencyKey: "k1"},
			&quotav1.CheckRequest{Policies: []string{"big", "small"}, IdempotencyKey: "k1"}},
		{"peek then same policy charged", &quotav1.CheckRequest{Policies: []string{"small"}, Peek: true, IdempotencyKey: "k2"},
			&quotav1.CheckRequest{Policies: []string{"small"}, IdempotencyKey: "k2"}},
		{"other policies", &quotav1.CheckRequest{Policies: []string{"big"}, IdempotencyKey: "k3"},
			&quotav1.CheckRequest{Policies: []string{"small"}, IdempotencyKey: "k3"}},
		{"higher cost", &quotav1.CheckRequest{Policies: []string{"big"}, IdempotencyKey: "k4"},
			&quotav1.CheckRequest{Policies: []string{"big"}, Cost: 90, IdempotencyKey: "k4"}},
		{"policies reordered", &quotav1.CheckRequest{Policies: []string{"big", "keyed"}, IdempotencyKey: "k5"},
			&quotav1.CheckRequest{Policies: []string{"keyed", "big"}, IdempotencyKey: "k5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := check(tc.first)
			if err != nil || first.Replayed {
				t.Fatalf("first: %v %v", first, err)
			}
			calls := h.store.calls.Load()
			r, err := check(tc.then)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("key reused for another request = %v, %v; want InvalidArgument", r, err)
			}
			if n := h.store.calls.Load() - calls; n != 0 {
				t.Fatalf("rejected reuse reached the store %d times", n)
			}
			again, err := check(tc.first)
			if err != nil || !again.Replayed {
				t.Fatalf("identical retry = %v, %v; want replayed", again, err)
			}
		})
	}
	// Within one batch: the peek and the charge under one key are refused
	// before either is decided.
	calls := h.store.calls.Load()
	_, err := h.adm.CheckBatch(ctxT(t), &quotav1.CheckBatchRequest{Checks: []*quotav1.CheckRequest{
		{Subject: "idem-attack", Policies: []string{"small"}, Peek: true, IdempotencyKey: "k6"},
		{Subject: "idem-attack", Policies: []string{"small"}, IdempotencyKey: "k6"},
	}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("batch reusing a key = %v, want InvalidArgument", err)
	}
	if n := h.store.calls.Load() - calls; n != 0 {
		t.Fatalf("refused batch reached the store %d times", n)
	}
}
