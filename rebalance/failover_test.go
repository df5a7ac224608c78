package rebalance

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
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

// planFixture returns the exports policy and a default Config, for tests
// of plan and observe without etcd.
func planFixture(t *testing.T) (*policy.Set, Config) {
	t.Helper()
	set, err := policy.Parse("exports.yaml", []byte(exportsDoc))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{Client: &clientv3.Client{}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return set, cfg
}

// TestPlanOverPendingShrinkShrinksAgain: a region registers while a
// shrink epoch waits for c's acknowledgement. The new plan (which must
// include the new region) may not publish growth: c may still enforce
// the epoch before the shrink, whose shares the shrink record does not
// hold. It publishes another shrink from the pending one.
func TestPlanOverPendingShrinkShrinksAgain(t *testing.T) {
	set, cfg := planFixture(t)
	// Epoch 1: c held most; epoch 2 shrinks c toward b. a and b
	// acknowledged 2, c did not; d just registered.
	cur := &etcdlayout.Allocation{
		Policy: "exports", Epoch: 2, Phase: etcdlayout.PhaseShrink,
		Default: map[string]float64{"a": 0.2, "b": 0.2, "c": 0.2},
		Target:  &etcdlayout.Shares{Default: map[string]float64{"a": 0.2, "b": 0.6, "c": 0.2}},
		Safe:    map[string]float64{"a": 0.05, "b": 0.05, "c": 0.05},
	}
	reg := etcdlayout.Registration{}
	snap := &snapshot{
		rev:  10,
		live: map[string]map[string]etcdlayout.Registration{"a": {"n": reg}, "b": {"n": reg}, "c": {"n": reg}, "d": {"n": reg}},
		acks: map[string]map[string]etcdlayout.Ack{
			"a": {"n": {Epochs: map[string]uint64{"exports": 2}}},
			"b": {"n": {Epochs: map[string]uint64{"exports": 2}}},
			"c": {"n": {Epochs: map[string]uint64{"exports": 1}}},
		},
		controls:  map[string]etcdlayout.Control{},
		policies:  set,
		allocs:    map[string]*etcdlayout.Allocation{"exports": cur},
		allocRevs: map[string]int64{"exports": 9},
	}
	st := newState()
	st.demand["exports"] = map[string]float64{"a": 0.2, "b": 0.6, "c": 0.2, "d": 0}
	now := time.Unix(1_700_000_000, 0)
	for _, full := range []bool{false, true} {
		plans := plan(now, snap, st, &cfg, full)
		if len(plans) != 1 || plans[0].pub == nil {
			t.Fatalf("full=%v: want one publish, got %+v", full, plans)
		}
		pub := plans[0].pub
		if pub.Phase != etcdlayout.PhaseShrink || pub.Target == nil || pub.Epoch != 3 {
			t.Fatalf("full=%v: over a pending shrink got phase %s epoch %d, want shrink 3: %+v", full, pub.Phase, pub.Epoch, pub)
		}
		for r, s := range cur.Default {
			if pub.Default[r] > s+1e-12 {
				t.Errorf("full=%v: region %s grows %v → %v before c acknowledged", full, r, s, pub.Default[r])
			}
		}
		if _, ok := pub.Target.Default["d"]; !ok {
			t.Errorf("full=%v: target leaves out the new region d: %v", full, pub.Target.Default)
		}
		sum := 0.0
		for _, s := range pub.Target.Default {
			sum += s
		}
		if sum > 1+1e-9 {
			t.Errorf("full=%v: target sums to %v", full, sum)
		}
	}
}

// TestAllocationReservesNamedMinimums: a region the policy names a
// minimum for enforces it outside any allocation, even before it ever
// registers, so the plan reserves it.
func TestAllocationReservesNamedMinimums(t *testing.T) {
	const doc = `policies:
  - name: exports
    capacity: 50
    rate: 600/minute
    min_share:
      default: 0.05
      eu: 0.3
`
	set, err := policy.Parse("exports.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{Client: &clientv3.Client{}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	reg := etcdlayout.Registration{}
	snap := &snapshot{
		live:      map[string]map[string]etcdlayout.Registration{"us": {"n": reg}, "ap": {"n": reg}},
		demand:    map[string]etcdlayout.DemandReport{},
		acks:      map[string]map[string]etcdlayout.Ack{},
		controls:  map[string]etcdlayout.Control{},
		policies:  set,
		allocs:    map[string]*etcdlayout.Allocation{},
		allocRevs: map[string]int64{},
	}
	plans := plan(time.Unix(1_700_000_000, 0), snap, newState(), &cfg, true)
	if len(plans) != 1 || plans[0].pub == nil {
		t.Fatalf("want one publish, got %+v", plans)
	}
	a := plans[0].pub
	if a.Default["eu"] != 0.3 || a.Safe["eu"] != 0.3 {
		t.Fatalf("eu (named minimum 0.3, not registered) got share %v safe %v", a.Default["eu"], a.Safe["eu"])
	}
	if sum := a.Default["us"] + a.Default["ap"] + a.Default["eu"]; sum > 1+1e-9 {
		t.Fatalf("shares sum to %v: %v", sum, a.Default)
	}
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
		_, ok := l.st.missingSince["c"]
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
		return l.st.returned["c"]
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
	back := l.st.returned["c"]
	l.mu.Unlock()
	if back {
		t.Error("c still counted as just back after a full round observed its report")
	}
	checkInvariant(t, e)
}

// TestFirstObservationComesFromAReport: a live region without a demand
// report gets no smoothed demand; its first report is then taken as it
// is, not smoothed up from 0.
func TestFirstObservationComesFromAReport(t *testing.T) {
	set, cfg := planFixture(t)
	reg := etcdlayout.Registration{}
	report := func(offered float64) etcdlayout.DemandReport {
		return etcdlayout.DemandReport{Policies: map[string]etcdlayout.PolicyDemand{"exports": {Offered: offered}}}
	}
	snap := &snapshot{
		live:     map[string]map[string]etcdlayout.Registration{"a": {"n": reg}, "b": {"n": reg}, "c": {"n": reg}},
		demand:   map[string]etcdlayout.DemandReport{"a": report(10), "b": report(10)},
		policies: set,
	}
	st := newState()
	st.returned["c"] = true
	st.observe(snap, &cfg)
	if d, ok := st.demand["exports"]["c"]; ok {
		t.Fatalf("c has demand %v before any report", d)
	}
	if !st.returned["c"] {
		t.Fatal("c no longer counted as just back before any report")
	}
	snap.demand["c"] = report(20)
	st.observe(snap, &cfg)
	if got := st.demand["exports"]["c"]; got != 0.5 {
		t.Fatalf("c's first observation %v, want 0.5 (20 of 40, as it is)", got)
	}
	if st.returned["c"] {
		t.Fatal("c still counted as just back after a round observed its report")
	}
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
