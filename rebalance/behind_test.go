package rebalance

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCutOffNodeStaysReservedAcrossFailover: region c has nodes c1 and
// c2 at safe share 0.3; an operator lowers c's minimum to 0.05, and c1
// is cut off before it acknowledges (its lease ends; alive, it keeps
// enforcing 0.3). The leader that saw c1 go fails, and a new one takes
// over; c2 acknowledges. The new leader must still reserve c's 0.3: it
// reads c1 back from etcd, where the first leader kept it.
func TestCutOffNodeStaysReservedAcrossFailover(t *testing.T) {
	e := newEnv(t, "a", "b")
	ctx := context.Background()
	c1 := coordtest.NewNode(e.cli, e.layout, "c", "c1")
	c2 := coordtest.NewNode(e.cli, e.layout, "c", "c2")
	for _, n := range []*coordtest.Region{c1, c2} {
		if err := n.Register(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Kill)
	}
	nodes := []*coordtest.Region{e.regions["a"], e.regions["b"], c1, c2}
	ackAll := func(ns ...*coordtest.Region) {
		t.Helper()
		for _, n := range ns {
			if _, err := n.AckLatest(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	minimum := func(c float64) {
		t.Helper()
		data, _ := json.Marshal(etcdlayout.Control{Minimums: map[string]float64{"c": c}})
		if _, err := e.cli.Put(ctx, e.layout.Control("exports"), string(data)); err != nil {
			t.Fatal(err)
		}
	}
	e.demand(t, map[string]float64{"a": 30, "b": 30})
	minimum(0.3)
	cli1 := e.srv.Client(t)
	l1, stop1 := startLoop(t, Config{Client: cli1, Name: "l1", SkewMargin: 100 * time.Millisecond})
	waitLeader(t, l1)
	l2, _ := startLoop(t, Config{Client: e.cli, Name: "l2", SkewMargin: 100 * time.Millisecond})
	for a := e.alloc(t); a.Phase != etcdlayout.PhaseStable || a.Safe["c"] != 0.3; a = e.alloc(t) {
		ackAll(nodes...)
		if _, err := l1.RebalanceNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ackAll(nodes...)
	minimum(0.05)
	if _, err := l1.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	lowered := e.alloc(t)
	if lowered.Safe["c"] != 0.05 || lowered.Held["c"] != 0.3 {
		t.Fatalf("lowering c's minimum: safe %v held %v, want c at 0.05 holding 0.3", lowered.Safe, lowered.Held)
	}
	c1.Kill()
	waitFor(t, "c1's lease to end", 10*time.Second, func() bool {
		resp, err := e.cli.Get(ctx, e.layout.Node("c", "c1"))
		return err == nil && len(resp.Kvs) == 0
	})
	if _, err := l1.RebalanceNow(ctx); err != nil { // l1 sees c1 gone
		t.Fatal(err)
	}
	_ = cli1.Close()
	stop1()
	waitLeader(t, l2)
	time.Sleep(300 * time.Millisecond) // past the new leader's skew margin
	for range 4 {
		ackAll(e.regions["a"], e.regions["b"], c2)
		if _, err := l2.RebalanceNow(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	if a := e.alloc(t); a.Default["c"] < 0.3-1e-9 {
		t.Errorf("epoch %d gives c %v while c1, cut off, may enforce 0.3 (held %v)", a.Epoch, a.Default["c"], a.Held)
	}
	checkInvariant(t, e)
	// c1 registers again and acknowledges: its old share is released.
	c1 = coordtest.NewNode(e.cli, e.layout, "c", "c1")
	if err := c1.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c1.Kill)
	waitFor(t, "c's share released once c1 is back", 10*time.Second, func() bool {
		ackAll(e.regions["a"], e.regions["b"], c1, c2)
		if _, err := l2.RebalanceNow(ctx); err != nil {
			t.Fatal(err)
		}
		return e.alloc(t).Default["c"] < 0.3-1e-9
	})
	resp, err := e.cli.Get(ctx, e.layout.BehindPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("vanished nodes still kept after c1 came back: %v %v", resp, err)
	}
	checkInvariant(t, e)
}
