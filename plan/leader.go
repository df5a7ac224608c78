package plan

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/quotacoord/quota/allocator"
)

// Bounds on what input can grow.
const (
	// MaxOverridesLimit is the largest accepted Params.MaxOverrides.
	MaxOverridesLimit = 1024
)

// ErrParams wraps every error about Params.
var ErrParams = errors.New("plan: invalid params")

// Params are the planner's rules. The zero value is not valid: every
// caller states its own (rebalance.Config and sim.Config hold the
// defaults).
type Params struct {
	// Algorithm, MaxStep and DeadBand go to allocator.Params; the
	// overcommit ε is the policy's.
	Algorithm allocator.Algorithm
	MaxStep   float64
	DeadBand  float64
	// Alpha is the demand smoothing factor in (0, 1], applied once per
	// full round.
	Alpha float64
	// Protocol is TwoStep or Naive.
	Protocol Protocol
	// MaxOverrides bounds the subject overrides per policy, and the
	// pressured subjects read from one region's report.
	MaxOverrides int
	// OverrideRounds is how many full rounds a subject keeps its smoothed
	// demand (and so its override) after the last report of pressure.
	OverrideRounds int
	// SkewMargin is how long after a node's registration vanished the
	// leader still counts it at its old shares.
	SkewMargin time.Duration
	// AckDeadline, when positive, is how long after the leader first saw
	// a shrink epoch it waits for a registered node's acknowledgement
	// (plus SkewMargin) before counting that node at its safe share: a
	// node whose watch of the allocations has been silent that long falls
	// back by itself (regionsync), so a stalled node cannot hold growth
	// back forever. 0 waits for every acknowledgement.
	AckDeadline time.Duration
}

// Validate reports whether p can plan.
func (p Params) Validate() error {
	if err := (allocator.Params{Algorithm: p.Algorithm, MaxStep: p.MaxStep, DeadBand: p.DeadBand}).Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrParams, err)
	}
	switch {
	case math.IsNaN(p.Alpha) || p.Alpha <= 0 || p.Alpha > 1:
		return fmt.Errorf("%w: Alpha %v must be in (0, 1]", ErrParams, p.Alpha)
	case p.Protocol != TwoStep && p.Protocol != Naive:
		return fmt.Errorf("%w: protocol %q is not %q or %q", ErrParams, p.Protocol, TwoStep, Naive)
	case p.MaxOverrides < 0 || p.MaxOverrides > MaxOverridesLimit:
		return fmt.Errorf("%w: MaxOverrides %d not in [0, %d]", ErrParams, p.MaxOverrides, MaxOverridesLimit)
	case p.OverrideRounds < 1:
		return fmt.Errorf("%w: OverrideRounds %d must be at least 1", ErrParams, p.OverrideRounds)
	case p.SkewMargin < 0:
		return fmt.Errorf("%w: SkewMargin %v is negative", ErrParams, p.SkewMargin)
	case p.AckDeadline < 0:
		return fmt.Errorf("%w: AckDeadline %v is negative", ErrParams, p.AckDeadline)
	}
	return nil
}

// Policy is what the planner needs of a policy.
type Policy struct {
	Name string
	// Rate is the global rate in cost units per second; a pressured
	// subject's demand is its offered rate over Rate.
	Rate       float64
	Overcommit float64
	// MinShare maps region to a minimum the policy names for it;
	// DefaultMinShare applies to every other region.
	MinShare        map[string]float64
	DefaultMinShare float64
}

// MinShareFor returns region's guaranteed minimum share.
func (p *Policy) MinShareFor(region string) float64 {
	if m, ok := p.MinShare[region]; ok {
		return m
	}
	return p.DefaultMinShare
}

// View is what a round reads of the regions, at one instant.
type View struct {
	// Regions maps each region with at least one registered node to its
	// registered nodes, by node id. A region is live while it has one.
	Regions map[string]map[string]Node
	// Demand maps a region to its demand per policy: the sum over its
	// nodes' latest reports. A region without an entry has not reported.
	Demand map[string]map[string]PolicyDemand
	// Retired are the regions an operator retired: while one has no
	// registered node, no allocation holds it (nor reserves its minimum).
	Retired map[string]bool
	// Behind is what a leader recorded of the nodes that lost their
	// registration before acknowledging (Leader.Behind), by region, node
	// and policy: read back by a new leader, which did not see them go.
	Behind map[string]Behind
}

// Behind maps each node of one region that lost its registration, until
// it registers again, to the epoch per policy it had acknowledged. Node
// "" holds the lowest epochs of nodes folded together to keep it bounded.
type Behind map[string]map[string]uint64

// Node is one registered node as a round sees it.
type Node struct {
	// Acked maps policy to the latest epoch the node acknowledged. A
	// Leader keeps the map a View hands it (Track): the caller must not
	// change it afterwards (a new View brings new maps).
	Acked map[string]uint64
	// Fingerprint identifies what decides a subject's bucket on the node:
	// its policies and their versions, its subject naming (salt, plain
	// keys, address grouping). Nodes that disagree count one tenant as
	// different subjects or limits; empty: not reported.
	Fingerprint string
}

// Mismatched lists the live regions that a round does not count as live
// because a node of theirs reports a fingerprint other than the one most
// nodes report (ties: the smallest), sorted.
func (v *View) Mismatched() []string {
	votes := map[string]int{}
	for _, nodes := range v.Regions {
		for _, n := range nodes {
			if n.Fingerprint != "" {
				votes[n.Fingerprint]++
			}
		}
	}
	if len(votes) < 2 {
		return nil
	}
	best := ""
	for fp, n := range votes {
		if best == "" || n > votes[best] || n == votes[best] && fp < best {
			best = fp
		}
	}
	var out []string
	for r, nodes := range v.Regions {
		for _, n := range nodes {
			if n.Fingerprint != "" && n.Fingerprint != best {
				out = append(out, r)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// nodeKey names a node within the leader's view.
type nodeKey struct{ region, node string }

// subjectDemand is one pressured subject's smoothed demand per region.
type subjectDemand struct {
	demand map[string]float64
	// idle counts full rounds since a region last reported the subject.
	idle int
}

// total is the subject's demand summed over regions in name order (a
// fixed order, so that equal inputs rank equally).
func (sd *subjectDemand) total() float64 {
	var buf [16]string
	regions := buf[:0]
	for r := range sd.demand {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	t := 0.0
	for _, r := range regions {
		t += sd.demand[r]
	}
	return t
}

// Leader is what a leading coordinator keeps between rounds: the smoothed
// demand, and what it saw of the regions' registrations. It can be rebuilt
// at any time: a new leader starts from NewLeader, and each policy's
// smoothing from the demand its allocation in force records (Track).
// Its methods take the instant they run at and read no clock; a Leader is
// not safe for concurrent use.
type Leader struct {
	params Params
	// demand is the smoothed share of each policy's offered load per
	// region (fractions summing to 1 over regions with demand).
	demand map[string]map[string]float64
	// subjects are the smoothed demands of pressured subjects, as
	// fractions of the policy's rate.
	subjects map[string]map[string]*subjectDemand
	// missingSince is when this leader first saw a region of an
	// allocation without any registered node.
	missingSince map[string]time.Time
	// nodes are the nodes registered in the last view tracked, with the
	// epoch per policy each had acknowledged.
	nodes map[nodeKey]map[string]uint64
	// behind is, per region and node, the epoch per policy a node had
	// acknowledged when this leader saw it lose its registration, until
	// the node registers again. Such a node may be alive and cut off,
	// enforcing the safe share of an epoch its region's other nodes have
	// long left: the region has not acknowledged a later epoch until it
	// comes back (held). Beyond MaxBehind nodes, the entries fold into
	// node "" of their region (the lowest epochs), kept until the region
	// is retired.
	behind  map[string]Behind
	nbehind int
	// nodeGone is, per region, when this leader last saw one of its nodes
	// lose its registration: such a node may enforce its old shares until
	// its lease TTL plus the skew margin.
	nodeGone map[string]time.Time
	// leadSince is when this leader took over. Nodes that vanished before
	// are unknown to it, so it treats that instant as a node vanishing in
	// every region.
	leadSince time.Time
	// returned are the regions that registered again after this leader
	// saw them without any node, until their first demand report: that
	// report is worth a full round at once (ReportArrived).
	returned map[string]bool
	// owed: a full round found a shrink still waiting and planned nothing
	// on the demand it read (Settle).
	owed bool
	// shrinkSeen is, per policy whose allocation in force is a shrink
	// epoch, that epoch and when this leader first saw it: the start of
	// its acknowledgement deadline on this leader's clock.
	shrinkSeen map[string]seenEpoch
	// mismatched is View.Mismatched of the view last tracked (tracked):
	// a round asks it once, not once per policy.
	tracked    *View
	mismatched []string
	// moving are the policies whose last observation moved their
	// smoothed demand by more than settleTolerance, or left a pressured
	// subject fading out: their next full round may plan differently on
	// the same reports (Settled).
	moving map[string]bool
}

// seenEpoch is an epoch and when the leader first saw it.
type seenEpoch struct {
	epoch uint64
	at    time.Time
}

// NewLeader returns the state of a leader that took over at since.
func NewLeader(p Params, since time.Time) (*Leader, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Leader{
		params:       p,
		demand:       make(map[string]map[string]float64),
		subjects:     make(map[string]map[string]*subjectDemand),
		missingSince: make(map[string]time.Time),
		nodes:        make(map[nodeKey]map[string]uint64),
		behind:       make(map[string]Behind),
		nodeGone:     make(map[string]time.Time),
		leadSince:    since,
		returned:     make(map[string]bool),
		shrinkSeen:   make(map[string]seenEpoch),
		moving:       make(map[string]bool),
	}, nil
}

// Params returns the leader's rules.
func (l *Leader) Params() Params { return l.params }

// Clone returns a deep copy of l, for a dry run that must not change it.
func (l *Leader) Clone() *Leader {
	c, _ := NewLeader(l.params, l.leadSince)
	for p, m := range l.demand {
		c.demand[p] = maps.Clone(m)
	}
	for p, m := range l.subjects {
		cm := make(map[string]*subjectDemand, len(m))
		for s, sd := range m {
			cm[s] = &subjectDemand{demand: maps.Clone(sd.demand), idle: sd.idle}
		}
		c.subjects[p] = cm
	}
	maps.Copy(c.missingSince, l.missingSince)
	maps.Copy(c.nodes, l.nodes) // the inner maps are never changed
	for r, ns := range l.behind {
		c.behind[r] = maps.Clone(ns)
	}
	c.nbehind = l.nbehind
	maps.Copy(c.nodeGone, l.nodeGone)
	maps.Copy(c.returned, l.returned)
	maps.Copy(c.shrinkSeen, l.shrinkSeen)
	maps.Copy(c.moving, l.moving)
	c.owed = l.owed
	return c
}

// Track records, at every round, which regions of the allocations lost
// their last registered node and since when, which of them registered
// again, and when nodes of any region vanished.
func (l *Leader) Track(now time.Time, v *View, allocs map[string]*Allocation) {
	for r := range l.missingSince {
		if _, ok := v.Regions[r]; ok {
			delete(l.missingSince, r)
			l.returned[r] = true // bounded: missingSince holds at most allocator.MaxRegions
		}
	}
	for r := range l.returned {
		if _, ok := v.Regions[r]; !ok {
			delete(l.returned, r)
		}
	}
	l.tracked, l.mismatched = v, v.Mismatched()
	l.recall(v)
	for k, acked := range l.nodes {
		if _, ok := v.Regions[k.region][k.node]; !ok {
			l.NodeGone(k.region, now)
			l.fellBehind(k, acked)
		}
	}
	clear(l.nodes)
	for r, nodes := range v.Regions {
		for n, node := range nodes {
			// Kept, not copied: a view's Acked maps are not changed
			// once handed over (View), and copying every node's epochs
			// would cost nodes × policies each round.
			l.nodes[nodeKey{r, n}] = node.Acked
			if _, ok := l.behind[r][n]; ok {
				delete(l.behind[r], n)
				l.nbehind--
			}
		}
	}
	for r := range v.Retired {
		if _, live := v.Regions[r]; !live {
			l.nbehind -= len(l.behind[r])
			delete(l.behind, r)
		}
	}
	for p, seen := range l.shrinkSeen {
		if a := allocs[p]; a == nil || a.Phase != PhaseShrink || a.Epoch != seen.epoch {
			delete(l.shrinkSeen, p)
		}
	}
	for p, a := range allocs {
		if a == nil {
			continue
		}
		l.recallDemand(p, a)
		if _, ok := l.shrinkSeen[p]; !ok && a.Phase == PhaseShrink {
			l.shrinkSeen[p] = seenEpoch{epoch: a.Epoch, at: now} // bounded by the policies
		}
		for r := range a.Default {
			if _, ok := v.Regions[r]; ok {
				continue
			}
			if _, ok := l.missingSince[r]; !ok && len(l.missingSince) < allocator.MaxRegions {
				l.missingSince[r] = now
			}
		}
	}
}

// recallDemand starts the smoothed demand of policy, which this leader
// has not observed, from the demand its allocation in force a was planned
// from (Allocation.Demand and SubjectDemand). Each region's report carries
// the noise of one interval, which the old leader's smoothing had
// averaged out: a new leader that took its first observation as it is
// would move most policies past the dead band on unchanged demand, and
// publish an epoch for each. Starting from the published demand, a new
// leader on unchanged reports plans what the old leader would have, and
// a policy whose demand did move still moves. A record without the
// demand, or with values no leader writes, leaves the first observation
// to the reports. At most allocator.MaxRegions regions and 2·MaxOverrides
// subjects (in name order) are taken.
func (l *Leader) recallDemand(policy string, a *Allocation) {
	if _, ok := l.demand[policy]; ok || len(a.Demand) == 0 && len(a.SubjectDemand) == 0 {
		return
	}
	if len(a.Demand) > allocator.MaxRegions || !demandValid(a.Demand) {
		return
	}
	l.demand[policy] = maps.Clone(a.Demand)
	sm := make(map[string]*subjectDemand, min(len(a.SubjectDemand), 2*l.params.MaxOverrides))
	for _, s := range slices.Sorted(maps.Keys(a.SubjectDemand)) {
		if len(sm) >= 2*l.params.MaxOverrides {
			break
		}
		if d := a.SubjectDemand[s]; s != "" && len(d) <= allocator.MaxRegions && demandValid(d) {
			sm[s] = &subjectDemand{demand: maps.Clone(d)}
		}
	}
	l.subjects[policy] = sm
}

// demandValid says every value of a recorded demand is a finite fraction
// at least 0.
func demandValid(d map[string]float64) bool {
	for _, v := range d {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return false
		}
	}
	return true
}

// record writes into a, about to be published for policy, the smoothed
// demand it was planned from (Allocation.Demand): that of the regions,
// and that of subjects, the ones the split ranked (Leader.ranked).
func (l *Leader) record(a *Allocation, policy string, subjects []string) {
	if d := l.demand[policy]; len(d) > 0 {
		a.Demand = maps.Clone(d)
	}
	for _, s := range subjects {
		if a.SubjectDemand == nil {
			a.SubjectDemand = make(map[string]map[string]float64)
		}
		a.SubjectDemand[s] = maps.Clone(l.subjects[policy][s].demand)
	}
}

// MaxBehind bounds the vanished nodes Leader.behind tracks one by one.
const MaxBehind = 4096

// recall adds the vanished nodes v.Behind records (a former leader saw
// them go) that this leader does not know of and that are not registered:
// such a node may still enforce the safe share of the epoch it last
// applied, whichever leader saw it go.
func (l *Leader) recall(v *View) {
	for r, ns := range v.Behind {
		for n, acked := range ns {
			if _, ok := l.behind[r][n]; ok {
				continue
			}
			if _, ok := v.Regions[r][n]; ok {
				continue
			}
			if _, folded := l.behind[r][""]; folded && n != "" {
				// Fold into the region's lowest epochs, as fellBehind does.
				l.behind[r][""] = LowerEpochs(l.behind[r][""], acked)
				continue
			}
			l.fellBehind(nodeKey{r, n}, maps.Clone(acked))
		}
	}
}

// Behind returns, per region, the vanished nodes this leader counts as
// not having acknowledged later epochs (View.Behind), for the caller to
// keep where a new leader reads them. At most MaxBehind nodes in all.
func (l *Leader) Behind() map[string]Behind {
	out := make(map[string]Behind, len(l.behind))
	for r, ns := range l.behind {
		if len(ns) > 0 {
			out[r] = maps.Clone(ns)
		}
	}
	return out
}

// LowerEpochs is the lower epoch per policy of a and b: what both of two
// nodes have acknowledged. A policy one of them lacks (never
// acknowledged) is left out, which reads as 0.
func LowerEpochs(a, b map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, min(len(a), len(b)))
	for p, e := range a {
		if o, ok := b[p]; ok {
			out[p] = min(e, o)
		}
	}
	return out
}

// fellBehind records that node k, which had acknowledged acked, lost its
// registration.
func (l *Leader) fellBehind(k nodeKey, acked map[string]uint64) {
	ns := l.behind[k.region]
	if ns == nil {
		ns = make(Behind)
		l.behind[k.region] = ns
	}
	if _, ok := ns[k.node]; !ok {
		l.nbehind++
	}
	ns[k.node] = acked
	if l.nbehind <= MaxBehind {
		return
	}
	// Fold every region's vanished nodes into its node "": the lowest
	// epoch per policy (a policy some node never acknowledged is 0).
	l.nbehind = 0
	for _, ns := range l.behind {
		var low map[string]uint64
		for _, acked := range ns {
			if low == nil {
				low = maps.Clone(acked)
			} else {
				low = LowerEpochs(low, acked)
			}
		}
		if low == nil {
			low = map[string]uint64{}
		}
		clear(ns)
		ns[""] = low
		l.nbehind++
	}
}

// NodeGone records that a node of region lost its registration at now
// (a watch may see a node come and go between two rounds).
func (l *Leader) NodeGone(region string, now time.Time) {
	if _, ok := l.nodeGone[region]; ok || len(l.nodeGone) < allocator.MaxRegions {
		l.nodeGone[region] = now
		return
	}
	// Out of room: forget the oldest region's entry, counting the instant
	// as a node gone everywhere (leadSince is checked for every region).
	var oldest string
	for r, t := range l.nodeGone {
		if oldest == "" || t.Before(l.nodeGone[oldest]) || t.Equal(l.nodeGone[oldest]) && r < oldest {
			oldest = r
		}
	}
	delete(l.nodeGone, oldest)
	l.nodeGone[region] = now
	if l.leadSince.Before(now) {
		l.leadSince = now
	}
}

// ReportArrived says whether a demand report of region, just written, is
// the first of a region back from having no registered node: that report
// is worth a full round at once rather than at the next tick, so that a
// region back from an outage does not wait a whole interval at its
// minimum. It answers true once per return.
func (l *Leader) ReportArrived(region string) bool {
	if !l.returned[region] {
		return false
	}
	delete(l.returned, region)
	return true
}

// Settle records the outcome of a round (full or not, whether some policy
// was deferred by a waiting shrink, whether anything was published) and
// says whether a full round must follow at once: a full round that found
// a shrink waiting planned nothing on the demand it read, so the round
// that publishes the growth is followed by a full round rather than
// leaving that demand a whole interval.
func (l *Leader) Settle(full, deferred, published bool) (fullRoundNow bool) {
	if l.owed && !deferred && published {
		l.owed = false
		fullRoundNow = !full
	}
	l.owed = l.owed || deferred
	return fullRoundNow
}

// Observe folds the regions' latest demand reports into the smoothed
// demand, once per full round, and forgets the policies not listed. A
// region's first observation (with no demand recalled for it, Track) is
// taken as it is, and only from a report: a region that registered and
// has not reported yet gets no demand (0 for now) rather than a first
// observation of 0 that its later reports would climb from one smoothing
// step at a time. Regions are read in name order and at most MaxOverrides
// subjects of a report, 4·MaxOverrides of a round and 2·MaxOverrides kept
// per policy.
func (l *Leader) Observe(v *View, policies []Policy) {
	l.ObserveSome(v, policies)
	keep := make(map[string]bool, len(policies))
	for i := range policies {
		keep[policies[i].Name] = true
	}
	for p := range l.demand {
		if !keep[p] {
			delete(l.demand, p)
			delete(l.subjects, p)
			delete(l.moving, p)
		}
	}
}

// ObserveSome is Observe for the listed policies only, forgetting none:
// a round that plans only the policies whose inputs changed (a caller
// that watches them) observes those. A policy left out keeps its smoothed
// demand; the caller must list it again while it is not Settled.
func (l *Leader) ObserveSome(v *View, policies []Policy) {
	for r := range l.returned {
		if _, ok := v.Demand[r]; ok {
			delete(l.returned, r)
		}
	}
	regions := slices.Sorted(maps.Keys(v.Demand))
	for i := range policies {
		if l.observePolicy(v, regions, &policies[i]) {
			l.moving[policies[i].Name] = true // bounded by the policies
		} else {
			delete(l.moving, policies[i].Name)
		}
	}
}

// Settled says that observing policy again on the same reports would
// move none of its smoothed demand by more than a tenth of the dead band
// (times Alpha, so that all the smoothing left adds up to less) and that
// none of its pressured subjects is fading out: a full round on unchanged
// reports, acknowledgements, controls and registrations would plan it as
// the last one did. A policy never observed is settled.
func (l *Leader) Settled(policy string) bool { return !l.moving[policy] }

// settleTolerance is the change of a smoothed demand under which an
// observation counts as settled (Settled).
func (l *Leader) settleTolerance() float64 {
	return max(l.params.Alpha*l.params.DeadBand/10, 1e-9)
}

// observePolicy observes p and reports whether its smoothed demand moved
// by more than settleTolerance or a subject of it is fading out.
func (l *Leader) observePolicy(v *View, reported []string, p *Policy) (moving bool) {
	a, maxOvr := l.params.Alpha, l.params.MaxOverrides
	tol := l.settleTolerance()
	set := func(m map[string]float64, r string, d float64) {
		if prev, ok := m[r]; !ok || math.Abs(d-prev) > tol {
			moving = true
		}
		m[r] = d
	}
	total := 0.0
	offered := make(map[string]float64)
	// The round's observations of pressured subjects, by subject in the
	// order first seen (region order, then report order).
	type observation struct {
		region string
		demand float64
	}
	var order []string
	subjects := make(map[string][]observation)
	for _, r := range reported {
		if _, ok := v.Regions[r]; !ok {
			continue
		}
		d, ok := v.Demand[r][p.Name]
		if !ok {
			continue
		}
		if o := orZero(d.Offered); o > 0 {
			offered[r] = o
			total += o
		}
		for i, s := range d.Pressured {
			if i >= maxOvr || s.Subject == "" {
				break
			}
			obs, ok := subjects[s.Subject]
			if !ok {
				if len(subjects) >= 4*maxOvr {
					continue
				}
				order = append(order, s.Subject)
			}
			o := observation{region: r}
			if p.Rate > 0 {
				o.demand = orZero(s.Offered) / p.Rate
			}
			subjects[s.Subject] = append(obs, o)
		}
	}
	dm := l.demand[p.Name]
	if dm == nil {
		dm = make(map[string]float64)
		l.demand[p.Name] = dm
	}
	for r := range dm {
		if _, ok := v.Regions[r]; !ok {
			delete(dm, r)
			moving = true
		}
	}
	if total > 0 {
		for r := range v.Regions {
			obs := offered[r] / total
			if prev, ok := dm[r]; ok {
				set(dm, r, allocator.Smooth(prev, obs, a))
			} else if _, reported := v.Demand[r]; reported {
				set(dm, r, obs)
			}
		}
	}
	sm := l.subjects[p.Name]
	if sm == nil {
		sm = make(map[string]*subjectDemand)
		l.subjects[p.Name] = sm
	}
	for s, sd := range sm {
		if _, ok := subjects[s]; ok {
			continue
		}
		sd.idle++
		moving = true
		for r, d := range sd.demand {
			sd.demand[r] = allocator.Smooth(d, 0, a)
		}
		if sd.idle >= l.params.OverrideRounds {
			delete(sm, s)
		}
	}
	for _, s := range order {
		obs := subjects[s]
		sd := sm[s]
		if sd == nil {
			// A new subject's demand is its observation as it is.
			if len(sm) >= 2*maxOvr {
				continue
			}
			sd = &subjectDemand{demand: make(map[string]float64, len(obs))}
			for _, o := range obs {
				sd.demand[o.region] = o.demand
			}
			sm[s] = sd
			moving = true
			continue
		}
		sd.idle = 0
		for r := range v.Regions {
			d := 0.0
			for _, o := range obs {
				if o.region == r {
					d = o.demand
				}
			}
			set(sd.demand, r, allocator.Smooth(sd.demand[r], d, a))
		}
	}
	return moving
}

// Demand returns the smoothed demand of policy per region (a copy), and
// of each of its pressured subjects.
func (l *Leader) Demand(policy string) (regions map[string]float64, subjects map[string]map[string]float64) {
	regions = maps.Clone(l.demand[policy])
	for s, sd := range l.subjects[policy] {
		if subjects == nil {
			subjects = make(map[string]map[string]float64)
		}
		subjects[s] = maps.Clone(sd.demand)
	}
	return regions, subjects
}

// MissingSince says since when this leader has seen region, a region of
// an allocation, without any registered node.
func (l *Leader) MissingSince(region string) (time.Time, bool) {
	t, ok := l.missingSince[region]
	return t, ok
}

// Returned says region registered again after this leader saw it without
// any node, and no demand report of it has been observed since.
func (l *Leader) Returned(region string) bool { return l.returned[region] }
