package regional

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestWindowChargedAtLowestShareSinceItsStart: region eu holds share 0.2
// of a daily fixed window of 100, and a subject spends its 20. The share
// then grows to 0.8 in the middle of the window (the other region, which
// held 0.8, may already have spent it). The subject gets nothing more in
// this window, in any algorithm: a window's count is charged against the
// lowest share since the window began. Without it eu would admit 60 more
// and the two regions 160 in one window of 100.
func TestWindowChargedAtLowestShareSinceItsStart(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	sync := runRegionSync(t, srv, regionsync.Config{Region: "eu", Node: "n1", LeaseTTL: 5 * time.Second})
	h := startNode(t, Config{Region: "eu", Shares: sync, Store: redisStore(t, redistest.Client(t)), StoreTimeout: time.Second},
		map[string]string{"own.yaml": `
policies:
  - {name: daily, algorithm: fixed_window, capacity: 100, window: 24h, failure_mode: closed}
  - {name: sliding, algorithm: sliding_window, capacity: 100, window: 24h, failure_mode: closed}
  - {name: log, algorithm: sliding_log, capacity: 100, window: 24h, failure_mode: closed}
`})
	ctx := ctxT(t)
	u := redistest.Unique(t)
	drain := func(policy string) (admitted int) {
		t.Helper()
		for range 120 {
			r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: u, Policies: []string{policy}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Degraded != "" {
				t.Fatalf("degraded check: %v", r)
			}
			if r.Allowed {
				admitted++
			}
		}
		return admitted
	}
	for _, p := range []string{"daily", "sliding", "log"} {
		putAllocation(t, cli, sync, p, 1, 0.2)
		if n := drain(p); n != 20 {
			t.Fatalf("%s at share 0.2: admitted %d, want 20", p, n)
		}
		putAllocation(t, cli, sync, p, 2, 0.8)
		if n := drain(p); n != 0 {
			t.Fatalf("%s after growing to 0.8 mid-window: admitted %d more, want 0 (the window was counted at 0.2)", p, n)
		}
	}
}
