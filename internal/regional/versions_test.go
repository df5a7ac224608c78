package regional

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestPolicyEditStartsNewBucketsSpent: a subject spends its budget, then
// the policy's limits change (new bucket keys). Within a refill time of
// the edit the subject gets only what the new limits refill since the edit,
// not a fresh full bucket; a fixed window reads the window of the edit as
// full. Policies of the node's first set start their buckets full.
func TestPolicyEditStartsNewBucketsSpent(t *testing.T) {
	clk := clock.NewManual(t0)
	before := `
policies:
  - {name: tb, capacity: 10, rate: 10/minute, failure_mode: closed}
  - {name: fw, algorithm: fixed_window, capacity: 5, window: 1m, failure_mode: closed}
  - {name: same, capacity: 10, rate: 10/minute, failure_mode: closed}
`
	after := `
policies:
  - {name: tb, capacity: 20, rate: 20/minute, failure_mode: closed}
  - {name: fw, algorithm: fixed_window, capacity: 6, window: 1m, failure_mode: closed}
  - {name: same, capacity: 10, rate: 10/minute, failure_mode: closed}
`
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Grants: trusting(t)}, map[string]string{"p.yaml": before})
	ctx := ctxT(t)
	check := func(pol string, cost int64) *quotav1.CheckResponse {
		t.Helper()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{pol}, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for pol, c := range map[string]int64{"tb": 10, "fw": 5, "same": 10} {
		if r := check(pol, c); !r.Allowed {
			t.Fatalf("%s: the first set's new bucket: %v, want %d admitted (full)", pol, r, c)
		}
	}
	clk.Advance(5 * time.Second) // t0 is 03:04:05: the edit falls in the window 03:04-03:05
	s, err := policy.Load(writePolicies(t, map[string]string{"p.yaml": after}))
	if err != nil {
		t.Fatal(err)
	}
	h.node.SetPolicies(s)
	if r := check("tb", 1); r.Allowed {
		t.Fatalf("tb right after the edit: %v, want denied (a fresh full bucket of 20 before)", r)
	}
	if r := check("fw", 1); r.Allowed {
		t.Fatalf("fw right after the edit: %v, want the edit's window full", r)
	}
	if r := check("same", 1); r.Allowed {
		t.Fatalf("an unchanged policy: %v, want its spent bucket kept", r)
	}
	clk.Advance(30 * time.Second)
	if r := check("tb", 11); r.Allowed {
		t.Fatalf("tb 30s after the edit, cost 11: %v, want denied (10 refilled)", r)
	}
	if r := check("tb", 10); !r.Allowed {
		t.Fatalf("tb 30s after the edit, cost 10: %v, want admitted", r)
	}
	clk.Advance(15 * time.Second) // 03:04:55
	if r := check("fw", 1); r.Allowed {
		t.Fatalf("fw in the edit's window: %v, want denied", r)
	}
	clk.Advance(5 * time.Second) // 03:05:00
	if r := check("fw", 6); !r.Allowed {
		t.Fatalf("fw in the next window: %v, want 6 admitted", r)
	}
	// Long after the edit (a refill and the idle TTL), new subjects start full.
	clk.Advance(time.Hour)
	r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "globex", Policies: []string{"tb"}, Cost: 20})
	if err != nil || !r.Allowed {
		t.Fatalf("a new subject an hour after the edit: %v, %v; want a full bucket", r, err)
	}
}
