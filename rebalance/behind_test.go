package rebalance

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// loweredMinimum is a run in which region c, with nodes c1 and c2, holds
// safe share 0.3 and an operator then lowers c's minimum to 0.05: leader
// l1 publishes the lowered epoch, which nobody acknowledged yet; l2 waits
// to take over.
type loweredMinimum struct {
	e      *env
	c1, c2 *coordtest.Region
	l1, l2 *Loop
	stop1  func() // closes l1's client and stops it
}

func lowerMinimum(t *testing.T) *loweredMinimum {
	t.Helper()
	e := newEnv(t, "a", "b")
	ctx := context.Background()
	r := &loweredMinimum{e: e, c1: coordtest.NewNode(e.cli, e.layout, "c", "c1"), c2: coordtest.NewNode(e.cli, e.layout, "c", "c2")}
	for _, n := range []*coordtest.Region{r.c1, r.c2} {
		if err := n.Register(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Kill)
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
	var stop1 func()
	r.l1, stop1 = startLoop(t, Config{Client: cli1, Name: "l1", SkewMargin: 100 * time.Millisecond})
	r.stop1 = func() { _ = cli1.Close(); stop1() }
	waitLeader(t, r.l1)
	r.l2, _ = startLoop(t, Config{Client: e.cli, Name: "l2", SkewMargin: 100 * time.Millisecond})
	all := []*coordtest.Region{e.regions["a"], e.regions["b"], r.c1, r.c2}
	for a := e.alloc(t); a.Phase != etcdlayout.PhaseStable || a.Safe["c"] != 0.3; a = e.alloc(t) {
		r.ackAll(t, all...)
		if _, err := r.l1.RebalanceNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r.ackAll(t, all...)
	minimum(0.05)
	if _, err := r.l1.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	if lowered := e.alloc(t); lowered.Safe["c"] != 0.05 || lowered.Held["c"] != 0.3 {
		t.Fatalf("lowering c's minimum: safe %v held %v, want c at 0.05 holding 0.3", lowered.Safe, lowered.Held)
	}
	return r
}

func (r *loweredMinimum) ackAll(t *testing.T, ns ...*coordtest.Region) {
	t.Helper()
	for _, n := range ns {
		if _, err := n.AckLatest(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// cutOffC1 kills c1 and waits for its registration to end.
func (r *loweredMinimum) cutOffC1(t *testing.T) {
	t.Helper()
	r.c1.Kill()
	waitFor(t, "c1's lease to end", 10*time.Second, func() bool {
		resp, err := r.e.cli.Get(context.Background(), r.e.layout.Node("c", "c1"))
		return err == nil && len(resp.Kvs) == 0
	})
}

// l2Leads waits for l2 to lead and runs four of its rounds, with a, b and
// c2 acknowledging, and checks that c still holds 0.3 and the invariant.
func (r *loweredMinimum) l2Leads(t *testing.T) {
	t.Helper()
	waitLeader(t, r.l2)
	time.Sleep(300 * time.Millisecond) // past the new leader's skew margin
	for range 4 {
		r.ackAll(t, r.e.regions["a"], r.e.regions["b"], r.c2)
		if _, err := r.l2.RebalanceNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	if a := r.e.alloc(t); a.Default["c"] < 0.3-1e-9 {
		t.Errorf("epoch %d gives c %v while c1, cut off, may enforce 0.3 (held %v)", a.Epoch, a.Default["c"], a.Held)
	}
	checkInvariant(t, r.e)
}

// TestCutOffNodeStaysReservedAcrossFailover: c1 is cut off before it
// acknowledges the lowered minimum (its lease ends; alive, it keeps
// enforcing 0.3). The leader that saw c1 go fails, and a new one takes
// over; c2 acknowledges. The new leader must still reserve c's 0.3: it
// reads c1 back from etcd, where the first leader kept it.
func TestCutOffNodeStaysReservedAcrossFailover(t *testing.T) {
	r := lowerMinimum(t)
	e, ctx := r.e, context.Background()
	r.cutOffC1(t)
	if _, err := r.l1.RebalanceNow(ctx); err != nil { // l1 sees c1 gone
		t.Fatal(err)
	}
	r.stop1()
	r.l2Leads(t)
	// c1 registers again and acknowledges: its old share is released.
	c1 := coordtest.NewNode(e.cli, e.layout, "c", "c1")
	if err := c1.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c1.Kill)
	waitFor(t, "c's share released once c1 is back", 10*time.Second, func() bool {
		r.ackAll(t, e.regions["a"], e.regions["b"], c1, r.c2)
		if _, err := r.l2.RebalanceNow(ctx); err != nil {
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

// TestNodeUnseenByAFailedLeaderStaysReserved: as above, but the leader
// fails before it runs a round that sees c1 go, so it never writes c1
// among the vanished nodes. c1's acknowledgement outlives its lease; the
// new leader reads it, keeps c1 among the vanished nodes and still
// reserves c's 0.3. Once that is written, the kept acknowledgement is
// deleted.
func TestNodeUnseenByAFailedLeaderStaysReserved(t *testing.T) {
	r := lowerMinimum(t)
	e, ctx := r.e, context.Background()
	r.stop1() // l1 fails first, then c1 is cut off: no leader sees it go
	r.cutOffC1(t)
	r.l2Leads(t)
	resp, err := e.cli.Get(ctx, e.layout.Behind("c"))
	if err != nil || len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), `"c1"`) {
		t.Fatalf("c1 not kept among c's vanished nodes: %v %v", resp, err)
	}
	if resp, err := e.cli.Get(ctx, e.layout.NodeAcks("c", "c1"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Errorf("c1's acknowledgement still kept once c1 is among the vanished nodes: %v %v", resp, err)
	}
}
