package regional

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestWokenNodeDecidesAtTheSafeShare: a node enforces share 0.75 of a
// policy of capacity 40; its process then sleeps past its lease TTL (the
// monotonic clock jumps, the wall clock is stepped back an hour, the
// loss-check ticker has not run). Its first check after waking is
// decided at the safe share 0.1 (limit 4), not at 0.75 (limit 30).
func TestWokenNodeDecidesAtTheSafeShare(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sync := runRegionSync(t, srv, regionsync.Config{Region: "eu", Node: "n1", LeaseTTL: 30 * time.Second, Clock: clk})
	h := startNode(t, Config{Region: "eu", Shares: sync, Clock: clk}, map[string]string{"own.yaml": `
policies:
  - {name: paused, capacity: 40, rate: 40/hour, failure_mode: closed}
`})
	putAllocation(t, cli, sync, "paused", 1, 0.75)
	ctx := ctxT(t)
	check := func() *quotav1.CheckResponse {
		t.Helper()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{"paused"}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := check(); r.Limit != 30 {
		t.Fatalf("limit %d before the pause, want 30", r.Limit)
	}
	clk.Advance(-time.Hour)
	clk.Advance(31 * time.Second)
	if r := check(); r.Limit != 4 {
		t.Fatalf("limit %d on the first check after sleeping past the lease TTL, want 4 (safe share 0.1)", r.Limit)
	}
}
