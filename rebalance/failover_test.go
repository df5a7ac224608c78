package rebalance

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRegionRegisteredBetweenReadAndPublish is the regression test for
// the reliability failure (TestCoordinatorLeaderKilledMidRebalance, Σ 1.2):
// region b registered after the leader's read and before its first
// publish. b read no allocation, so it enforced the policy's minimum,
// while the first epoch split the whole budget between a and c. The
// publish is now fenced on the registrations read: it fails, and the
// retry includes b.
func TestRegionRegisteredBetweenReadAndPublish(t *testing.T) {
	e := newEnv(t, "a", "c")
	ctx := context.Background()
	b := coordtest.NewRegion(e.cli, e.layout, "b")
	t.Cleanup(b.Kill)
	var once sync.Once
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1"}, func(l *Loop) {
		l.afterRead = func() {
			once.Do(func() {
				if err := b.Register(ctx, time.Second); err != nil {
					t.Error(err)
				}
			})
		}
	})
	waitLeader(t, l)
	var a etcdlayout.Allocation
	waitFor(t, "an allocation", 10*time.Second, func() bool {
		a = e.alloc(t)
		return a.Epoch > 0
	})
	first := e.epoch(t, 1)
	for _, r := range []string{"a", "b", "c"} {
		if _, ok := first.Default[r]; !ok {
			t.Errorf("epoch 1 leaves out region %s: %v", r, first.Default)
		}
	}
	checkInvariant(t, e)
}

// TestLateRegionStartsFromNothing: a region that registers after the
// first epoch enforced nothing of the policy (it has no safe share there
// and the policy names no minimum for it), so the shrink that makes room
// for it gives it nothing either; it grows only after every region
// acknowledged the shrink (found by internal/e2e: a at 1.0 not yet
// acknowledged, b given its default minimum 0.02 at once).
func TestLateRegionStartsFromNothing(t *testing.T) {
	e := newEnv(t, "a")
	ctx := context.Background()
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1"})
	waitLeader(t, l)
	first := roundStable(t, e, l)
	if first.Default["a"] != 1 {
		t.Fatalf("a alone: %v", first.Default)
	}
	b := coordtest.NewRegion(e.cli, e.layout, "b")
	if err := b.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Kill)
	var shrink etcdlayout.Allocation
	waitFor(t, "a shrink that includes b", 10*time.Second, func() bool {
		shrink = e.alloc(t)
		return shrink.Epoch > first.Epoch
	})
	if shrink.Phase != etcdlayout.PhaseShrink || shrink.Default["b"] != 0 || shrink.Target.Default["b"] < 0.05 {
		t.Fatalf("want a shrink giving b 0 now and at least its minimum later, got %+v", shrink)
	}
	checkInvariant(t, e)
}

// stableABC starts regions a, b and c and a leader (Interval an hour,
// SkewMargin 100 ms), and returns once a round settled on a stable
// allocation.
func stableABC(t *testing.T) (*env, *Loop) {
	t.Helper()
	e := newEnv(t, "a", "b", "c")
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", SkewMargin: 100 * time.Millisecond})
	waitLeader(t, l)
	roundStable(t, e, l)
	return e, l
}

// TestReturnedRegionFirstReportRunsFullRound: region c loses its last
// node, registers again and reports; its first report brings a full round
// at once (the loop's Interval is an hour and nothing calls RebalanceNow),
// and that round takes c's demand as it is.
func TestReturnedRegionFirstReportRunsFullRound(t *testing.T) {
	e, l := stableABC(t)
	ctx := context.Background()
	actx, stopAcks := context.WithCancel(ctx)
	var acking []func()
	t.Cleanup(func() {
		stopAcks()
		for _, wait := range acking {
			wait()
		}
	})
	for _, n := range []string{"a", "b"} {
		acking = append(acking, e.regions[n].AutoAck(actx))
	}
	e.regions["c"].Kill()
	waitFor(t, "c's lease to expire", 10*time.Second, func() bool {
		resp, err := e.cli.Get(ctx, e.layout.RegionNodes("c"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 0
	})
	// The registration watch's round sees c without a node.
	waitFor(t, "the loop to note c missing", 10*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		_, ok := l.ld.MissingSince("c")
		return ok
	})
	c := coordtest.NewRegion(e.cli, e.layout, "c")
	t.Cleanup(c.Kill)
	if err := c.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	acking = append(acking, c.AutoAck(actx))
	waitFor(t, "the loop to note c back", 10*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.ld.Returned("c")
	})
	before := e.alloc(t)
	// c now carries 3/4 of the offered load.
	if err := c.Report(ctx, time.Second, map[string]etcdlayout.PolicyDemand{"exports": {Offered: 30, Admitted: 10}}); err != nil {
		t.Fatal(err)
	}
	var a etcdlayout.Allocation
	waitFor(t, "c's share to follow its first report", 10*time.Second, func() bool {
		a = e.alloc(t)
		return a.Phase == etcdlayout.PhaseStable && a.Epoch > before.Epoch && a.Default["c"] > 0.5
	})
	if a.Default["c"] <= a.Default["a"] {
		t.Fatalf("after c's first report: %v", a.Default)
	}
	l.mu.Lock()
	back := l.ld.Returned("c")
	l.mu.Unlock()
	if back {
		t.Error("c still counted as just back after a full round observed its report")
	}
	checkInvariant(t, e)
}

// TestDeferredRoundRunsAfterGrowth: a full round that finds a shrink
// still waiting plans nothing; once the acknowledgements let the growth
// out, a full round follows at once (the Interval is an hour) and plans
// the demand read meanwhile.
func TestDeferredRoundRunsAfterGrowth(t *testing.T) {
	e, l := stableABC(t)
	ctx := context.Background()
	for _, r := range e.regions {
		if _, err := r.AckLatest(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.demand(t, map[string]float64{"a": 20, "b": 5, "c": 5})
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	shrink := e.alloc(t)
	if shrink.Phase != etcdlayout.PhaseShrink {
		t.Fatalf("want a shrink toward a, got %+v", shrink)
	}
	// Demand moves to c while the shrink waits: the round defers.
	e.demand(t, map[string]float64{"a": 1, "b": 1, "c": 30})
	res, err := l.RebalanceNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Published) != 0 || len(res.Waiting) == 0 {
		t.Fatalf("round over a waiting shrink: %+v", res)
	}
	for _, r := range e.regions {
		if err := r.Ack(ctx, "exports", shrink.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	// The growth to a, then at once a plan toward c.
	var a etcdlayout.Allocation
	waitFor(t, "a plan toward c after the growth", 10*time.Second, func() bool {
		a = e.alloc(t)
		return a.Epoch >= shrink.Epoch+2
	})
	grown := e.epoch(t, shrink.Epoch+1)
	if grown.Phase != etcdlayout.PhaseStable {
		t.Fatalf("epoch %d: %+v, want the growth", shrink.Epoch+1, grown)
	}
	next := e.epoch(t, shrink.Epoch+2)
	target := next.Default
	if next.Target != nil {
		target = next.Target.Default
	}
	if target["c"] <= grown.Default["c"] {
		t.Fatalf("epoch %d does not move toward c: %v after %v", next.Epoch, target, grown.Default)
	}
	checkInvariant(t, e)
}

// TestNewLeaderFirstRoundPublishesWhatChanged: a leader settles steady
// policies; their next reports are a little off (a region 1.5% above
// its share, as one interval's noise makes them), which that leader's
// smoothing keeps within the dead band. The leader is then replaced,
// and one policy's demand moves meanwhile. The new leader's first round
// publishes that policy and none of the steady ones: it smooths from
// the demand the allocations record, where a new leader starting from
// the reports as they are moved every steady policy past the dead band.
func TestNewLeaderFirstRoundPublishesWhatChanged(t *testing.T) {
	const steady = 20
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	var doc strings.Builder
	doc.WriteString("policies:\n")
	names := []string{"moved"}
	for i := range steady {
		names = append(names, "steady-"+strconv.Itoa(i))
	}
	for _, n := range names {
		fmt.Fprintf(&doc, "  - name: %s\n    capacity: 100\n    rate: 100/second\n", n)
	}
	if err := coordtest.PutPolicy(ctx, e.cli, e.layout, "fleet.yaml", []byte(doc.String())); err != nil {
		t.Fatal(err)
	}
	report := func(steadyOffered, movedOffered map[string]float64) {
		t.Helper()
		for r, reg := range e.regions {
			ds := map[string]etcdlayout.PolicyDemand{"moved": {Offered: movedOffered[r]}}
			for _, n := range names[1:] {
				ds[n] = etcdlayout.PolicyDemand{Offered: steadyOffered[r]}
			}
			if err := reg.Report(ctx, time.Second, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	autoAck(t, e.regions["a"], e.regions["b"], e.regions["c"])
	cli1 := e.srv.Client(t)
	c1, stop := startLoop(t, Config{Client: cli1, Name: "c1", SkewMargin: 100 * time.Millisecond})
	waitLeader(t, c1)
	even := map[string]float64{"a": 50, "b": 30, "c": 20}
	report(even, even)
	waitFor(t, "the first leader to settle", 15*time.Second, func() bool {
		res, err := c1.RebalanceNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Published) == 0 && len(res.Waiting) == 0
	})
	noisy := map[string]float64{"a": 51.5, "b": 29, "c": 19.5}
	report(noisy, even)
	if res, err := c1.RebalanceNow(ctx); err != nil || len(res.Published) > 0 {
		t.Fatalf("the first leader moved on a report within the dead band: %+v, %v", res, err)
	}
	before, err := coordtest.Allocations(ctx, e.cli, e.layout)
	if err != nil {
		t.Fatal(err)
	}
	report(noisy, map[string]float64{"a": 20, "b": 30, "c": 50})

	_ = cli1.Close()
	stop()
	firstRound := make(chan struct{})
	var once sync.Once
	c2, _ := startLoop(t, Config{Client: e.srv.Client(t), Name: "c2", SkewMargin: 100 * time.Millisecond}, func(l *Loop) {
		l.afterPlan = func(kind roundKind, _ []string) {
			if kind == roundEvery {
				once.Do(func() { close(firstRound) })
			}
		}
	})
	waitLeader(t, c2)
	select {
	case <-firstRound:
	case <-time.After(15 * time.Second):
		t.Fatal("the new leader planned no round")
	}
	var after map[string]etcdlayout.Allocation
	waitFor(t, "the moved policy's next epoch", 10*time.Second, func() bool {
		if after, err = coordtest.Allocations(ctx, e.cli, e.layout); err != nil {
			t.Fatal(err)
		}
		return after["moved"].Epoch > before["moved"].Epoch
	})
	var moved []string
	for _, n := range names[1:] {
		if after[n].Epoch != before[n].Epoch {
			moved = append(moved, fmt.Sprintf("%s %d→%d %v→%v", n, before[n].Epoch, after[n].Epoch, before[n].Default, after[n].Default))
		}
	}
	if len(moved) > 0 {
		t.Errorf("the new leader's first round published %d of %d steady policies: %v", len(moved), steady, moved)
	}
	target := after["moved"].Default
	if after["moved"].Target != nil {
		target = after["moved"].Target.Default
	}
	if target["c"] <= before["moved"].Default["c"] {
		t.Errorf("the moved policy's epoch %d does not move toward c: %v after %v", after["moved"].Epoch, target, before["moved"].Default)
	}
	checkInvariant(t, e)
}
