package regional

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestNewBucketAfterGrowthStartsAtTheLowestShare: region eu held share 0.2
// of a policy of capacity 100 refilled in an hour, then grew to 0.8. A
// subject that never checked here (it may have spent its budget in the
// other region) gets a new bucket holding what the lowest share of the
// last hour allows, 0.2 × 100 = 20 tokens, not the grown 80. A subject
// whose bucket lived through the growth gets no tokens from it either.
func TestNewBucketAfterGrowthStartsAtTheLowestShare(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	sync := runRegionSync(t, srv, regionsync.Config{Region: "eu", Node: "n1", LeaseTTL: 5 * time.Second})
	h := startNode(t, Config{Region: "eu", Shares: sync, Store: redisStore(t, redistest.Client(t)), StoreTimeout: time.Second},
		map[string]string{"own.yaml": `
policies:
  - {name: grown, capacity: 100, rate: 100/hour, failure_mode: closed}
`})
	ctx := ctxT(t)
	u := redistest.Unique(t)
	drain := func(subject string) (admitted int, limit int64) {
		t.Helper()
		for range 120 {
			r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"grown"}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Degraded != "" {
				t.Fatalf("degraded check: %v", r)
			}
			if r.Allowed {
				admitted++
			}
			limit = r.Limit
		}
		return admitted, limit
	}
	putAllocation(t, cli, sync, "grown", 1, 0.2)
	if n, _ := drain(u + "-before"); n != 20 {
		t.Fatalf("a new subject at share 0.2 was admitted %d times, want 20", n)
	}
	putAllocation(t, cli, sync, "grown", 2, 0.8)
	if n, limit := drain(u + "-new"); n != 20 || limit != 80 {
		t.Fatalf("a new subject after the growth to 0.8: admitted %d at limit %v, want 20 (the lowest share of the last refill time) at limit 80", n, limit)
	}
	if n, _ := drain(u + "-before"); n != 0 {
		t.Fatalf("a subject drained before the growth was admitted %d times after it, want 0", n)
	}
}
