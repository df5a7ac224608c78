package rebalance

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/plan"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// settledRound returns a snapshot of policies policies × regions regions
// × nodes nodes per region, every node having acknowledged every
// allocation and every region reporting the same steady demand, and a
// Leader on which every policy has settled.
func settledRound(tb testing.TB, policies, regions, nodes int) (*snapshot, []plan.Policy, *plan.Leader, time.Time) {
	tb.Helper()
	cfg, err := Config{Client: &clientv3.Client{}}.withDefaults()
	if err != nil {
		tb.Fatal(err)
	}
	pols := make([]plan.Policy, policies)
	snap := &snapshot{
		view: &plan.View{Regions: map[string]map[string]plan.Node{}, Demand: map[string]map[string]plan.PolicyDemand{},
			Retired: map[string]bool{}, Behind: map[string]plan.Behind{}},
		controls: map[string]etcdlayout.Control{},
		allocs:   map[string]*etcdlayout.Allocation{},
	}
	for i := range pols {
		pols[i] = plan.Policy{Name: "p" + strconv.Itoa(i), Rate: 10000}
	}
	for r := range regions {
		region := "r" + strconv.Itoa(r)
		snap.view.Regions[region] = map[string]plan.Node{}
		for n := range nodes {
			acked := make(map[string]uint64, policies)
			for _, p := range pols {
				acked[p.Name] = 1
			}
			snap.view.Regions[region]["n"+strconv.Itoa(n)] = plan.Node{Acked: acked}
		}
		snap.view.Demand[region] = map[string]plan.PolicyDemand{}
		for _, p := range pols {
			snap.view.Demand[region][p.Name] = plan.PolicyDemand{Offered: 1000, Admitted: 1000}
		}
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ld, err := plan.NewLeader(cfg.params(), now.Add(-time.Hour))
	if err != nil {
		tb.Fatal(err)
	}
	// The first rounds publish and observe until nothing moves.
	for range 3 {
		plans, _ := planRound(now, snap, pols, ld, true, nil)
		for _, d := range plans {
			if d.Publish != nil {
				snap.allocs[d.Policy] = d.Publish
			}
		}
	}
	for _, a := range snap.allocs {
		a.Epoch = 1
	}
	return snap, pols, ld, now
}

// TestChangedRoundCopiesNoAcks: a round over 20 changed policies of
// 2,000, with 60 nodes that acknowledged them all, allocates far less
// than the nodes' acknowledged epochs take (it keeps the view's maps).
func TestChangedRoundCopiesNoAcks(t *testing.T) {
	snap, pols, ld, now := settledRound(t, 2000, 3, 20)
	dirty := map[string]bool{}
	for i := range 20 {
		dirty[pols[i*100].Name] = true
	}
	pick := func(p string) bool { return dirty[p] || !ld.Settled(p) || !plan.Idle(snap.view, snap.allocs[p]) }
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, planned := planRound(now, snap, pols, ld, true, pick)
	runtime.ReadMemStats(&after)
	if len(planned) != 20 {
		t.Fatalf("planned %d policies, want the 20 changed", len(planned))
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 2<<20 {
		t.Fatalf("a round over 20 policies allocated %d KiB, want at most 2 MiB (60 nodes × 2,000 epochs copied would be more)", got>>10)
	}
}

// BenchmarkPlanRound plans one full round of issue 17's target point,
// 10,000 policies × 12 regions × 25 nodes per region (300 nodes), in
// memory: every policy settled on steady demand, then a round over the
// 100 policies whose demand changed ("changed") or over every policy
// ("every"). The etcd read and the publish are not included.
func BenchmarkPlanRound(b *testing.B) {
	const policies, regions, nodes, changed = 10000, 12, 25, 100
	snap, pols, ld, now := settledRound(b, policies, regions, nodes)
	for _, every := range []bool{false, true} {
		name := "changed"
		if every {
			name = "every"
		}
		b.Run(name, func(b *testing.B) {
			dirty := map[string]bool{}
			for i := range changed {
				dirty[pols[i*(policies/changed)].Name] = true
			}
			pick := func(p string) bool { return dirty[p] || !ld.Settled(p) || !plan.Idle(snap.view, snap.allocs[p]) }
			if every {
				pick = nil
			}
			for b.Loop() {
				_, planned := planRound(now, snap, pols, ld, true, pick)
				if !every && len(planned) != changed {
					b.Fatalf("planned %d policies, want %d", len(planned), changed)
				}
			}
		})
	}
}
