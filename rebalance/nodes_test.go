package rebalance

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// addNode registers a second node of region and has it report offered.
func addNode(t *testing.T, e *env, region, node string, offered float64) *coordtest.Region {
	t.Helper()
	ctx := context.Background()
	n := coordtest.NewNode(e.cli, e.layout, region, node)
	if err := n.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Kill)
	d := etcdlayout.PolicyDemand{Offered: offered, Admitted: offered}
	if err := n.Report(ctx, time.Second, map[string]etcdlayout.PolicyDemand{"exports": d}); err != nil {
		t.Fatal(err)
	}
	return n
}

func ackAll(t *testing.T, rs ...*coordtest.Region) {
	t.Helper()
	for _, r := range rs {
		if _, err := r.AckLatest(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRegionOfTwoNodesKeepsShareWhenOneStops: region a runs two nodes; one
// stops gracefully (its lease revoked, its keys gone). The region is still
// live through the other, so it keeps its share: nothing is handed away
// while a node still enforces it.
func TestRegionOfTwoNodesKeepsShareWhenOneStops(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	a2 := addNode(t, e, "a", "node-1", 0)
	actx, cancel := context.WithCancel(ctx)
	for _, r := range []*coordtest.Region{e.regions["a"], e.regions["b"], e.regions["c"], a2} {
		defer r.AutoAck(actx)()
	}
	defer cancel()
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", SkewMargin: 100 * time.Millisecond})
	waitLeader(t, l)
	e.demand(t, map[string]float64{"a": 10})
	var before etcdlayout.Allocation
	for range 4 {
		before = roundStable(t, e, l)
	}
	if before.Default["a"] < 0.8 {
		t.Fatalf("demand only in a: share %v", before.Default)
	}
	if err := a2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		after := roundStable(t, e, l)
		if math.Abs(after.Default["a"]-before.Default["a"]) > 1e-9 {
			t.Fatalf("a's share moved from %v to %v after one of its two nodes stopped", before.Default["a"], after.Default["a"])
		}
	}
	checkInvariant(t, e)
}

// TestGrowthWaitsForEveryNode: region a runs two nodes; growth after a
// shrink waits until both acknowledged it.
func TestGrowthWaitsForEveryNode(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	a2 := addNode(t, e, "a", "node-1", 5)
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", SkewMargin: 200 * time.Millisecond})
	waitLeader(t, l)
	first := roundStable(t, e, l)
	ackAll(t, e.regions["a"], e.regions["b"], e.regions["c"], a2)
	e.demand(t, map[string]float64{"b": 10})
	if err := a2.Report(ctx, time.Second, map[string]etcdlayout.PolicyDemand{"exports": {}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	shrink := e.alloc(t)
	if shrink.Phase != etcdlayout.PhaseShrink || shrink.Epoch != first.Epoch+1 || shrink.Default["a"] >= first.Default["a"] {
		t.Fatalf("want a shrink of a after epoch %d, got %+v", first.Epoch, shrink)
	}
	ackAll(t, e.regions["a"], e.regions["b"], e.regions["c"])
	res, err := l.RebalanceNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Waiting) != 1 || len(res.Published) != 0 {
		t.Fatalf("want waiting for a's second node, got %+v", res)
	}
	time.Sleep(200 * time.Millisecond)
	if got := e.alloc(t); got.Epoch != shrink.Epoch {
		t.Fatalf("grew before a's second node acknowledged: %+v", got)
	}
	ackAll(t, a2)
	waitFor(t, "growth after the last node's ack", 10*time.Second, func() bool {
		return e.alloc(t).Epoch > shrink.Epoch
	})
	if grown := e.epoch(t, shrink.Epoch+1); grown.Phase != etcdlayout.PhaseStable {
		t.Fatalf("epoch %d after the last ack: %+v, want the growth", shrink.Epoch+1, grown)
	}
	checkInvariant(t, e)
}

// TestDemandSummedOverNodes: a's two nodes each see half of what b sees
// alone; the split treats a and b alike.
func TestDemandSummedOverNodes(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	addNode(t, e, "a", "node-1", 4)
	e.demand(t, map[string]float64{"a": 4, "b": 8})
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1"})
	waitLeader(t, l)
	a := roundStable(t, e, l)
	if math.Abs(a.Default["a"]-a.Default["b"]) > 1e-9 || a.Default["a"] <= a.Default["c"] {
		t.Fatalf("a (4+4) and b (8) should split alike above c (0): %v", a.Default)
	}
	p, err := l.DryRun(context.Background(), "exports")
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(p.Demand["a"]-0.5) > 1e-9 || math.Abs(p.Demand["b"]-0.5) > 1e-9 {
		t.Fatalf("smoothed demand %v, want a and b at 0.5", p.Demand)
	}
}
