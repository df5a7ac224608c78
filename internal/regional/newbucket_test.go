package regional

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// growthEnv is region eu's node on Redis, with its region sync on a
// fresh etcd whose allocations a test publishes (putAllocation).
type growthEnv struct {
	node *harness
	cli  *clientv3.Client
	sync *regionsync.Syncer
}

func newGrowthEnv(t *testing.T, policies string) growthEnv {
	t.Helper()
	return newGrowthEnvClock(t, policies, nil)
}

// newGrowthEnvClock is newGrowthEnv with the node reading clk (nil: the
// wall clock).
func newGrowthEnvClock(t *testing.T, policies string, clk clock.Clock) growthEnv {
	t.Helper()
	srv := etcdtest.Start(t)
	sync := runRegionSync(t, srv, regionsync.Config{Region: "eu", Node: "n1", LeaseTTL: 5 * time.Second})
	h := startNode(t, Config{Region: "eu", Shares: sync, Store: redisStore(t, redistest.Client(t)), StoreTimeout: time.Second, Clock: clk},
		map[string]string{"own.yaml": policies})
	return growthEnv{node: h, cli: srv.Client(t), sync: sync}
}

// drain sends 120 checks of subject under policy and returns how many
// were admitted and the limit of the last.
func (g growthEnv) drain(t *testing.T, subject, policy string) (admitted int, limit int64) {
	t.Helper()
	ctx := ctxT(t)
	for range 120 {
		r, err := g.node.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{policy}})
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

// TestNewBucketAfterGrowthStartsAtTheLowestShare: region eu held share 0.2
// of a policy of capacity 100 refilled in an hour, then grew to 0.8. A
// subject that never checked here (it may have spent its budget in the
// other region) gets a new bucket holding what the lowest share of the
// last hour allows, 0.2 × 100 = 20 tokens, not the grown 80. A subject
// whose bucket lived through the growth gets no tokens from it either.
func TestNewBucketAfterGrowthStartsAtTheLowestShare(t *testing.T) {
	g := newGrowthEnv(t, `
policies:
  - {name: grown, capacity: 100, rate: 100/hour, failure_mode: closed}
`)
	u := redistest.Unique(t)
	putAllocation(t, g.cli, g.sync, "grown", 1, 0.2)
	if n, _ := g.drain(t, u+"-before", "grown"); n != 20 {
		t.Fatalf("a new subject at share 0.2 was admitted %d times, want 20", n)
	}
	putAllocation(t, g.cli, g.sync, "grown", 2, 0.8)
	if n, limit := g.drain(t, u+"-new", "grown"); n != 20 || limit != 80 {
		t.Fatalf("a new subject after the growth to 0.8: admitted %d at limit %v, want 20 (the lowest share of the last refill time) at limit 80", n, limit)
	}
	if n, _ := g.drain(t, u+"-before", "grown"); n != 0 {
		t.Fatalf("a subject drained before the growth was admitted %d times after it, want 0", n)
	}
}
