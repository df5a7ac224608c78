package rebalance

import (
	"maps"
	"reflect"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/plan"
)

// maxDirty bounds the policies a dirtySet names one by one; past it the
// next full round plans every policy (names come from records that nodes
// write, so they are not bounded by the policy documents).
const maxDirty = 1 << 16

// dirtySet is what changed since the leader's last full round: the
// policies whose demand, acknowledgements, controls, definition or
// allocation moved, or every policy when registrations, retired regions
// or the leader itself changed. A full round plans the policies it names,
// those the planner is not done with (plan.Leader.Settled, plan.Idle),
// and every policy each Config.FullEvery full rounds. Only the lead
// goroutine uses it.
type dirtySet struct {
	// all makes the next full round plan every policy; allUntil makes
	// every full round until then do so: the planner's rules that run on
	// time alone (a vanished node's shares held for the skew margin, a
	// new leader's wait) act without any record changing.
	all      bool
	allUntil time.Time
	policies map[string]bool
	// full counts the full rounds since the last one that planned every
	// policy.
	full int

	// What the last round read of the inputs diffed round to round.
	read      bool
	nodes     map[string]map[string]string // region → node → fingerprint
	retired   map[string]bool
	controls  map[string]etcdlayout.Control
	docsRev   int64
	docs      int
	policyDef map[string]plan.Policy
	allocRevs map[string]int64
}

func newDirtySet() *dirtySet {
	return &dirtySet{all: true, policies: map[string]bool{}}
}

// mark names policy as changed.
func (ds *dirtySet) mark(policy string) {
	if ds.all {
		return
	}
	if len(ds.policies) >= maxDirty {
		ds.everything()
		return
	}
	ds.policies[policy] = true
}

// everything makes the next full round plan every policy.
func (ds *dirtySet) everything() {
	ds.all = true
	clear(ds.policies)
}

// markChanged marks every key of before or after whose value differs
// (or is in only one of them).
func markChanged[V any](ds *dirtySet, before, after map[string]V, equal func(a, b V) bool) {
	for p, a := range after {
		if b, ok := before[p]; !ok || !equal(a, b) {
			ds.mark(p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			ds.mark(p)
		}
	}
}

// diff compares what snap read with the round before and marks what
// changed: any change of registrations (nodes, fingerprints) or retired
// regions marks every policy until hold has passed; a changed control,
// policy definition or allocation (published by this leader or anyone)
// marks its policy.
func (ds *dirtySet) diff(now time.Time, hold time.Duration, snap *snapshot, pols []plan.Policy) {
	nodes := make(map[string]map[string]string, len(snap.view.Regions))
	for r, ns := range snap.view.Regions {
		nodes[r] = make(map[string]string, len(ns))
		for n, nd := range ns {
			nodes[r][n] = nd.Fingerprint
		}
	}
	if !ds.read || !reflect.DeepEqual(nodes, ds.nodes) || !maps.Equal(snap.view.Retired, ds.retired) {
		ds.everything()
		ds.allUntil = now.Add(hold)
	}
	markChanged(ds, ds.controls, snap.controls, func(a, b etcdlayout.Control) bool { return reflect.DeepEqual(a, b) })
	if !ds.read || snap.docsRev != ds.docsRev || snap.docs != ds.docs {
		def := make(map[string]plan.Policy, len(pols))
		for _, p := range pols {
			def[p.Name] = p
		}
		markChanged(ds, ds.policyDef, def, func(a, b plan.Policy) bool { return reflect.DeepEqual(a, b) })
		ds.policyDef = def
	}
	markChanged(ds, ds.allocRevs, snap.allocRevs, func(a, b int64) bool { return a == b })
	ds.read = true
	ds.nodes, ds.retired, ds.controls = nodes, maps.Clone(snap.view.Retired), snap.controls
	ds.docsRev, ds.docs, ds.allocRevs = snap.docsRev, snap.docs, snap.allocRevs
}

// pick returns what a full round at now plans: nil for every policy
// (sweep forces it), else the test of whether one policy is planned.
func (ds *dirtySet) pick(now time.Time, sweep bool, ld *plan.Leader, view *plan.View, allocs map[string]*etcdlayout.Allocation) func(string) bool {
	if sweep || ds.all || now.Before(ds.allUntil) {
		return nil
	}
	return func(p string) bool {
		return ds.policies[p] || !ld.Settled(p) || !plan.Idle(view, allocs[p])
	}
}

// planned records that a full round planned what pick chose.
func (ds *dirtySet) planned(every bool) {
	ds.all = false
	clear(ds.policies)
	if every {
		ds.full = 0
	} else {
		ds.full++
	}
}
