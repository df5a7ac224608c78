package reliability

import (
	"context"
	"math"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
)

// etcdRun starts the load, runs fault (which sets the load's phase) and
// records the entry with the invariant replayed from etcd's history.
func etcdRun(t *testing.T, name string, e *etcdEnv, fault func(l *regionLoad) time.Duration) {
	t.Helper()
	e.ready(t, 30*time.Second)
	e.leader(t, 30*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	l, wait := e.load(ctx)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wait()
		}
	}
	defer stop()
	time.Sleep(pick(500*time.Millisecond, 3*time.Second))
	recovery := fault(l)
	time.Sleep(pick(500*time.Millisecond, 3*time.Second))
	stop()
	rep := e.replay(t)
	for _, b := range l.bad {
		t.Errorf("lost decision: %s", b)
	}
	var errs int64
	for _, c := range e.coords {
		if err := c.stop(); err != nil {
			errs++
			t.Errorf("%s: %v", c.name, err)
		}
	}
	record(t, Entry{Kind: KindFault, Name: name, Injected: true, Survived: !t.Failed(), Decisions: l.during(),
		Lost: l.lostTotal(), InvariantChecks: int64(rep.Revisions), Violations: int64(len(rep.Violations)),
		Recovery: recovery, Note: "epochs " + itoa(int64(rep.Epochs)) + ", max Σ " + ftoa(rep.MaxSum)})
}

// atSafeShare waits until r has lost its lease and enforces its safe share.
func atSafeShare(t *testing.T, r *region, d time.Duration) {
	t.Helper()
	waitFor(t, r.name+" to fall back to its safe share", d, func() bool {
		return r.sync.Lost() && math.Abs(r.sync.Share("exports", "tenant-1")-safeShare) < 1e-9
	})
}

// TestEtcdUnavailableLongerThanLease: etcd stops for longer than the
// regional lease TTL; every region falls to its safe share by itself,
// keeps deciding, and returns to published shares when etcd is back.
func TestEtcdUnavailableLongerThanLease(t *testing.T) {
	e := newEtcdEnv(t, []string{"a", "b", "c"}, 1)
	etcdRun(t, "etcd unavailable longer than the lease TTL", e, func(l *regionLoad) time.Duration {
		e.srv.Stop()
		l.phase.Store("fault")
		for _, r := range e.regions {
			atSafeShare(t, r, regionLeaseTTL+5*time.Second)
		}
		time.Sleep(pick(time.Second, 10*time.Second))
		l.phase.Store("after")
		if err := e.srv.Restart(); err != nil {
			t.Fatalf("restart etcd: %v", err)
		}
		return e.ready(t, 30*time.Second)
	})
}

// TestCoordinatorLeaderKilledMidRebalance: the leader dies (its
// connections reset, its process gone) while an allocation waits in the
// shrink phase; the other coordinator takes over and finishes it.
func TestCoordinatorLeaderKilledMidRebalance(t *testing.T) {
	e := newEtcdEnv(t, []string{"a", "b", "c"}, 2)
	etcdRun(t, "coordinator leader killed mid-rebalance", e, func(l *regionLoad) time.Duration {
		// Slow one region's acknowledgements so a shrink phase lasts.
		if err := e.regions["c"].proxy.SetLatency(150 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		var shrink etcdlayout.Allocation
		waitFor(t, "an allocation in the shrink phase", 30*time.Second, func() bool {
			a, ok := e.alloc(t)
			shrink = a
			return ok && a.Phase == etcdlayout.PhaseShrink
		})
		old := e.leader(t, time.Second)
		setMode(t, old.proxy, faultproxy.Reset)
		if err := old.stop(); err != nil {
			t.Errorf("killed leader: %v", err)
		}
		l.phase.Store("fault")
		killed := time.Now()
		var next *coord
		waitFor(t, "another coordinator to lead", 20*time.Second, func() bool {
			for _, c := range e.coords {
				if c != old && c.loop.IsLeader() {
					next = c
					return true
				}
			}
			return false
		})
		waitFor(t, "the new leader to publish past the interrupted epoch", 20*time.Second, func() bool {
			a, ok := e.alloc(t)
			return ok && a.Epoch > shrink.Epoch && a.Phase == etcdlayout.PhaseStable
		})
		l.phase.Store("after")
		t.Logf("leader %s killed at epoch %d (shrink); %s leads", old.name, shrink.Epoch, next.name)
		return time.Since(killed)
	})
}

// TestCoordinatorsPartitioned: the leader is cut off from etcd (and so
// from the other coordinator); the other takes over, the cut-off one's
// writes are fenced, and after the partition heals one leader remains.
func TestCoordinatorsPartitioned(t *testing.T) {
	e := newEtcdEnv(t, []string{"a", "b", "c"}, 2)
	etcdRun(t, "coordinators partitioned from each other", e, func(l *regionLoad) time.Duration {
		old := e.leader(t, time.Second)
		before, _ := e.alloc(t)
		setMode(t, old.proxy, faultproxy.Blackhole)
		l.phase.Store("fault")
		var next *coord
		waitFor(t, "the other coordinator to lead", 30*time.Second, func() bool {
			for _, c := range e.coords {
				if c != old && c.loop.IsLeader() {
					next = c
					return true
				}
			}
			return false
		})
		waitFor(t, "a publish by the new leader", 30*time.Second, func() bool {
			a, ok := e.alloc(t)
			return ok && a.Epoch > before.Epoch
		})
		time.Sleep(pick(time.Second, 10*time.Second))
		l.phase.Store("after")
		setMode(t, old.proxy, faultproxy.Pass)
		healed := time.Now()
		waitFor(t, "one leader after the partition", 30*time.Second, func() bool {
			return !old.loop.IsLeader() && next.loop.IsLeader()
		})
		// Still one leader a little later.
		time.Sleep(500 * time.Millisecond)
		if old.loop.IsLeader() && next.loop.IsLeader() {
			t.Errorf("two leaders after the partition healed")
		}
		return time.Since(healed)
	})
}

// TestRegionReportsLostOrLate: one region's link to etcd is cut for
// longer than its lease (reports and keepalives lost) and then slowed
// (reports late); it falls to its safe share while cut off and returns.
func TestRegionReportsLostOrLate(t *testing.T) {
	e := newEtcdEnv(t, []string{"a", "b", "c"}, 1)
	etcdRun(t, "region reports lost, then late", e, func(l *regionLoad) time.Duration {
		c := e.regions["c"]
		setMode(t, c.proxy, faultproxy.Blackhole)
		l.phase.Store("fault")
		atSafeShare(t, c, regionLeaseTTL+5*time.Second)
		waitFor(t, "c's registration to expire", 10*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			resp, err := e.admin.Get(ctx, e.layout.RegionNodes("c"), clientv3.WithPrefix())
			return err == nil && len(resp.Kvs) == 0
		})
		time.Sleep(pick(500*time.Millisecond, 5*time.Second))
		// Late, not lost: 30ms each way. (establish grants and registers
		// within one RequestTimeout, LeaseTTL/3 here, so a round trip
		// above a sixth of the lease TTL never registers; see the report.)
		if err := c.proxy.SetLatency(30 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		setMode(t, c.proxy, faultproxy.Pass)
		healed := time.Now()
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("logs:\n%s", e.logs.String())
			}
		})
		waitFor(t, "c to hold published shares again over a slow link", 30*time.Second, c.sync.Ready)
		rec := time.Since(healed)
		time.Sleep(pick(time.Second, 5*time.Second))
		if !c.sync.Ready() {
			t.Errorf("region c lost its shares again with late (30ms) reports")
		}
		l.phase.Store("after")
		if err := c.proxy.SetLatency(0); err != nil {
			t.Fatal(err)
		}
		return rec
	})
}
