package rebalance

import (
	"slices"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/plan"
)

// snapshot is everything a round reads, at one etcd revision.
type snapshot struct {
	rev int64
	// view holds the registered nodes with their acknowledgements, and
	// each live region's demand summed over its nodes' reports.
	view     *plan.View
	controls map[string]etcdlayout.Control
	policies *policy.Set
	// policyErrs are documents that did not load.
	policyErrs []error
	allocs     map[string]*etcdlayout.Allocation
	allocRevs  map[string]int64
	// storedBehind is the behind/ records as read, before the kept
	// acknowledgements of unregistered nodes joined view.Behind.
	storedBehind map[string]plan.Behind
	// keptAcks are the unregistered nodes whose acknowledgements are
	// still kept, per region.
	keptAcks map[string][]string
	// docsRev is the highest mod revision of the policy documents and
	// docs their number: the policies changed when either did.
	docsRev int64
	docs    int
	// ackMoved names the policies whose acknowledgements changed since
	// the metrics last looked (metrics.observe consumes it); every policy
	// after a registration changed or the records were read. nil: every
	// policy.
	ackMoved *dirtySet
}

// planPolicies are the policies of snap the planner allocates (unlimited
// policies have no shares), in the planner's terms.
func (snap *snapshot) planPolicies() []plan.Policy {
	var out []plan.Policy
	for _, p := range snap.policies.Policies() {
		if !p.Unlimited {
			out = append(out, planPolicy(p))
		}
	}
	return out
}

// planPolicy is what the planner needs of p.
func planPolicy(p *policy.Policy) plan.Policy {
	return plan.Policy{
		Name:            p.Name,
		Rate:            rate(p),
		Overcommit:      p.Limits.Overcommit,
		MinShare:        p.MinShare,
		DefaultMinShare: p.DefaultMinShare,
	}
}

// rate is the policy's global rate in cost units per second.
func rate(p *policy.Policy) float64 {
	if p.Limits.RefillPerSecond > 0 {
		return p.Limits.RefillPerSecond
	}
	if p.Limits.Window > 0 {
		return float64(p.Limits.Capacity) / p.Limits.Window.Seconds()
	}
	return float64(p.Limits.Capacity)
}

// planRound runs the planner over the policies of snap (pols, their
// planPolicies) and returns its decisions and the policies it planned. A full round observes demand first and plans the policies pick
// selects (every one when pick is nil); a round that is not full plans
// only the policies it may act on (not plan.Idle). It changes only ld.
func planRound(now time.Time, snap *snapshot, pols []plan.Policy, ld *plan.Leader, full bool, pick func(string) bool) ([]plan.Decision, []plan.Policy) {
	ld.Track(now, snap.view, snap.allocs)
	picked := pols
	switch {
	case !full:
		picked = slices.DeleteFunc(slices.Clone(pols), func(p plan.Policy) bool { return plan.Idle(snap.view, snap.allocs[p.Name]) })
	case pick == nil:
		ld.Observe(snap.view, pols)
	default:
		picked = slices.DeleteFunc(slices.Clone(pols), func(p plan.Policy) bool { return !pick(p.Name) })
		ld.ObserveSome(snap.view, picked)
	}
	var out []plan.Decision
	for _, p := range picked {
		d := ld.Plan(now, snap.view, p, snap.allocs[p.Name], snap.controls[p.Name], full)
		if d.Publish != nil || d.Note != "" || d.Proposal != nil {
			out = append(out, d)
		}
	}
	return out, picked
}
