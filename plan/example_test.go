package plan_test

import (
	"fmt"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/plan"
)

// Two regions, demand moving to eu: the round shrinks us first and grows
// eu once both regions acknowledged the shrink.
func ExampleLeader_Plan() {
	params := plan.Params{Algorithm: allocator.MaxMinFair, MaxStep: 1, DeadBand: 0.01, Alpha: 1,
		Protocol: plan.TwoStep, MaxOverrides: 8, OverrideRounds: 3, SkewMargin: 2 * time.Second}
	now := time.Unix(1_700_000_000, 0)
	leader, err := plan.NewLeader(params, now.Add(-time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	exports := plan.Policy{Name: "exports", Rate: 10, DefaultMinShare: 0.1}
	cur := &plan.Allocation{Policy: "exports", Epoch: 1, Phase: plan.PhaseStable,
		Default: map[string]float64{"eu": 0.5, "us": 0.5}, Safe: map[string]float64{"eu": 0.1, "us": 0.1}}
	acked := func(epoch uint64) map[string]plan.Node {
		return map[string]plan.Node{"node-1": {Acked: map[string]uint64{"exports": epoch}}}
	}
	view := &plan.View{
		Regions: map[string]map[string]plan.Node{"eu": acked(1), "us": acked(1)},
		Demand: map[string]map[string]plan.PolicyDemand{
			"eu": {"exports": {Offered: 30}},
			"us": {"exports": {Offered: 10}},
		},
	}
	leader.Track(now, view, map[string]*plan.Allocation{"exports": cur})
	leader.Observe(view, []plan.Policy{exports})
	d := leader.Plan(now, view, exports, cur, plan.Control{}, true)
	fmt.Printf("epoch %d %s: eu %.2f us %.2f, then eu %.2f us %.2f\n", d.Publish.Epoch, d.Publish.Phase,
		d.Publish.Default["eu"], d.Publish.Default["us"], d.Publish.Target.Default["eu"], d.Publish.Target.Default["us"])

	cur = d.Publish
	d = leader.Plan(now, view, exports, cur, plan.Control{}, false)
	fmt.Println("waiting:", d.Note)

	view.Regions = map[string]map[string]plan.Node{"eu": acked(2), "us": acked(2)}
	d = leader.Plan(now, view, exports, cur, plan.Control{}, false)
	fmt.Printf("epoch %d %s: eu %.2f us %.2f\n", d.Publish.Epoch, d.Publish.Phase, d.Publish.Default["eu"], d.Publish.Default["us"])
	// Output:
	// epoch 2 shrink: eu 0.50 us 0.25, then eu 0.75 us 0.25
	// waiting: waiting for node node-1 of region eu to acknowledge epoch 2 (it holds 1)
	// epoch 3 stable: eu 0.75 us 0.25
}
