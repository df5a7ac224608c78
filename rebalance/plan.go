package rebalance

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
)

// eq is the tolerance under which two shares are the same.
const eq = 1e-12

// snapshot is everything a round reads, at one etcd revision.
type snapshot struct {
	rev int64
	// live maps each region with at least one registered node to its
	// nodes' registrations (node id → registration).
	live map[string]map[string]etcdlayout.Registration
	// demand is each region's demand, summed over its nodes' reports.
	demand map[string]etcdlayout.DemandReport
	// acks maps region to node id to that node's acknowledgement.
	acks     map[string]map[string]etcdlayout.Ack
	controls map[string]etcdlayout.Control
	policies *policy.Set
	// policyErrs are documents that did not load.
	policyErrs []error
	allocs     map[string]*etcdlayout.Allocation
	allocRevs  map[string]int64
}

// subjectDemand is one pressured subject's smoothed demand per region.
type subjectDemand struct {
	demand map[string]float64
	// idle counts rounds since a region last reported the subject.
	idle int
}

// state is what the leader keeps between rounds. It can be rebuilt from
// the latest reports at any time (a new leader starts empty).
type state struct {
	// demand is the smoothed share of each policy's offered load per
	// region (fractions summing to 1 over regions with demand).
	demand map[string]map[string]float64
	// subjects are the smoothed demands of pressured subjects, as
	// fractions of the policy's global rate.
	subjects map[string]map[string]*subjectDemand
	// missingSince is when this leader first saw a region of an
	// allocation without any registered node.
	missingSince map[string]time.Time
	// nodes are the nodes ("region/node") registered in the last snapshot.
	nodes map[string]bool
	// nodeGone is, per region, when this leader last saw one of its
	// nodes lose its registration (a node of a live region that vanished
	// may enforce its old shares until its lease TTL plus the skew margin).
	nodeGone map[string]time.Time
	// leadSince is when this leader took over (zero: not leading). Nodes
	// that vanished before it are unknown to it, so it treats that
	// instant as a node vanishing in every region.
	leadSince time.Time
	// returned are the regions that registered again after this leader
	// saw them without any node, until a full round observes their first
	// demand report: that report brings a full round at once (Loop.lead)
	// rather than at the next tick, so a region back from an outage does
	// not wait an Interval at its minimum share.
	returned map[string]bool
}

func newState() *state {
	return &state{
		demand:       make(map[string]map[string]float64),
		subjects:     make(map[string]map[string]*subjectDemand),
		missingSince: make(map[string]time.Time),
		nodes:        make(map[string]bool),
		nodeGone:     make(map[string]time.Time),
		returned:     make(map[string]bool),
	}
}

func (st *state) clone() *state {
	c := newState()
	for p, m := range st.demand {
		c.demand[p] = maps.Clone(m)
	}
	for p, m := range st.subjects {
		cm := make(map[string]*subjectDemand, len(m))
		for s, sd := range m {
			cm[s] = &subjectDemand{demand: maps.Clone(sd.demand), idle: sd.idle}
		}
		c.subjects[p] = cm
	}
	maps.Copy(c.missingSince, st.missingSince)
	maps.Copy(c.nodes, st.nodes)
	maps.Copy(c.nodeGone, st.nodeGone)
	maps.Copy(c.returned, st.returned)
	c.leadSince = st.leadSince
	return c
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

// trackMissing records when regions of published allocations lost their
// last registered node, which of them registered again, and when nodes of
// any region vanished.
func (st *state) trackMissing(now time.Time, snap *snapshot) {
	for r := range st.missingSince {
		if _, ok := snap.live[r]; ok {
			delete(st.missingSince, r)
			st.returned[r] = true // bounded: missingSince holds at most MaxRegions
		}
	}
	for r := range st.returned {
		if _, ok := snap.live[r]; !ok {
			delete(st.returned, r)
		}
	}
	for key := range st.nodes {
		region, node, _ := strings.Cut(key, "/")
		if _, ok := snap.live[region][node]; !ok {
			st.nodeGoneAt(region, now)
		}
	}
	clear(st.nodes)
	for r, nodes := range snap.live {
		for n := range nodes {
			st.nodes[r+"/"+n] = true
		}
	}
	for _, a := range snap.allocs {
		for r := range a.Default {
			if _, ok := snap.live[r]; ok {
				continue
			}
			if _, ok := st.missingSince[r]; !ok && len(st.missingSince) < MaxRegions {
				st.missingSince[r] = now
			}
		}
	}
}

// nodeGoneAt records that a node of region lost its registration at now.
func (st *state) nodeGoneAt(region string, now time.Time) {
	if _, ok := st.nodeGone[region]; ok || len(st.nodeGone) < MaxRegions {
		st.nodeGone[region] = now
		return
	}
	// Out of room: forget the oldest region's entry, counting the
	// instant as a node gone everywhere (leadSince is checked for every
	// region).
	var oldest string
	for r, t := range st.nodeGone {
		if oldest == "" || t.Before(st.nodeGone[oldest]) {
			oldest = r
		}
	}
	delete(st.nodeGone, oldest)
	st.nodeGone[region] = now
	if st.leadSince.Before(now) {
		st.leadSince = now
	}
}

// observe smooths the demand reports of live regions into st. A region's
// first observation is taken as it is, and only from a report: a region
// that registered and has not reported yet gets no demand (the plan gives
// it demand 0 for now) rather than a first observation of 0 that its later
// reports would climb from one smoothing step at a time.
func (st *state) observe(snap *snapshot, cfg *Config) {
	for r := range st.returned {
		if _, ok := snap.demand[r]; ok {
			delete(st.returned, r)
		}
	}
	for _, p := range snap.policies.Policies() {
		total := 0.0
		offered := make(map[string]float64)
		subjects := make(map[string]map[string]float64)
		for r, rep := range snap.demand {
			if _, ok := snap.live[r]; !ok {
				continue
			}
			d, ok := rep.Policies[p.Name]
			if !ok {
				continue
			}
			if o := finite(d.Offered); o > 0 {
				offered[r] = o
				total += o
			}
			for i, s := range d.Pressured {
				if i >= cfg.MaxOverrides || s.Subject == "" {
					break
				}
				m := subjects[s.Subject]
				if m == nil {
					if len(subjects) >= 4*cfg.MaxOverrides {
						continue
					}
					m = make(map[string]float64)
					subjects[s.Subject] = m
				}
				m[r] = finite(s.Offered) / rate(p)
			}
		}
		dm := st.demand[p.Name]
		if dm == nil {
			dm = make(map[string]float64)
			st.demand[p.Name] = dm
		}
		for r := range dm {
			if _, ok := snap.live[r]; !ok {
				delete(dm, r)
			}
		}
		if total > 0 {
			for r := range snap.live {
				obs := offered[r] / total
				if prev, ok := dm[r]; ok {
					dm[r] = allocator.Smooth(prev, obs, cfg.Alpha)
				} else if _, reported := snap.demand[r]; reported {
					dm[r] = obs
				}
			}
		}
		sm := st.subjects[p.Name]
		if sm == nil {
			sm = make(map[string]*subjectDemand)
			st.subjects[p.Name] = sm
		}
		for s, sd := range sm {
			if _, ok := subjects[s]; !ok {
				sd.idle++
				for r, v := range sd.demand {
					sd.demand[r] = allocator.Smooth(v, 0, cfg.Alpha)
				}
				if sd.idle >= cfg.OverrideRounds {
					delete(sm, s)
				}
			}
		}
		for s, obs := range subjects {
			sd := sm[s]
			if sd == nil {
				if len(sm) >= 2*cfg.MaxOverrides {
					continue
				}
				sm[s] = &subjectDemand{demand: obs}
				continue
			}
			sd.idle = 0
			for r := range snap.live {
				sd.demand[r] = allocator.Smooth(sd.demand[r], obs[r], cfg.Alpha)
			}
		}
	}
	for p := range st.demand {
		if _, ok := snap.policies.Get(p); !ok {
			delete(st.demand, p)
			delete(st.subjects, p)
		}
	}
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}

// policyPlan is the outcome of a round for one policy.
type policyPlan struct {
	policy string
	// pub is the allocation to publish, nil when nothing moves.
	pub *etcdlayout.Allocation
	// prevRev is the allocation's mod revision read (0: none yet).
	prevRev int64
	// note says why nothing moves (waiting, frozen, error), if so.
	note string
	// proposal is the computed split (also when not published).
	proposal *etcdlayout.Shares
	// demand is the smoothed demand per region fed to the allocator.
	demand map[string]float64
	// deferred is set when a full round found a shrink still waiting and
	// planned nothing (Loop.lead runs a full round again once it grows).
	deferred bool
}

// plan computes one round. full rounds plan every policy; other rounds
// only finish pending shrinks. It reads st and changes nothing.
func plan(now time.Time, snap *snapshot, st *state, cfg *Config, full bool) []policyPlan {
	var out []policyPlan
	for _, p := range snap.policies.Policies() {
		if p.Unlimited {
			continue
		}
		pp := planPolicy(now, snap, st, cfg, p, full)
		if pp.pub != nil || pp.note != "" || pp.proposal != nil {
			out = append(out, pp)
		}
	}
	return out
}

func planPolicy(now time.Time, snap *snapshot, st *state, cfg *Config, p *policy.Policy, full bool) policyPlan {
	pp := policyPlan{policy: p.Name, prevRev: snap.allocRevs[p.Name]}
	cur := snap.allocs[p.Name]
	ctl := snap.controls[p.Name]
	if cur != nil && cur.Phase == etcdlayout.PhaseShrink && cur.Target != nil && coversLive(cur, snap) {
		if why := ackWait(now, snap, st, cfg, cur); why != "" {
			pp.note, pp.deferred = why, full
			return pp
		}
		pp.pub = &etcdlayout.Allocation{
			Policy:      p.Name,
			Epoch:       cur.Epoch + 1,
			Phase:       etcdlayout.PhaseStable,
			Default:     maps.Clone(cur.Target.Default),
			Overrides:   cloneOverrides(cur.Target.Overrides),
			Safe:        maps.Clone(cur.Safe),
			Overcommit:  cur.Overcommit,
			PublishedAt: now,
			Reason:      fmt.Sprintf("grow to the target of epoch %d: every region acknowledged it or lost its lease; %s", cur.Epoch, moves(cur.Default, cur.Target.Default, nil)),
		}
		return pp
	}
	if ctl.Frozen {
		pp.note = "frozen by an operator"
		return pp
	}
	// pending: cur is a shrink epoch whose growth has not been published.
	// Regions that did not acknowledge it may still enforce the epoch
	// before it, whose shares the record does not hold, so whatever
	// replaces it must again be a shrink from cur (each region's shares
	// only go down from what it may be enforcing) and grow only after
	// every region acknowledged that.
	pending := cur != nil && cur.Phase == etcdlayout.PhaseShrink
	// Acknowledgement and registration rounds also plan when a live
	// region has no share yet (or nothing was ever published): the plan
	// must include it before anyone grows.
	if !full && cur != nil && coversLive(cur, snap) {
		return pp
	}
	next, regions, err := proposal(snap, st, cfg, p, cur, ctl)
	if err != nil {
		pp.note = err.Error()
		return pp
	}
	pp.proposal = next
	pp.demand = make(map[string]float64, len(regions))
	for _, r := range regions {
		pp.demand[r.Name] = r.Demand
	}
	safe := make(map[string]float64, len(regions))
	for _, r := range regions {
		safe[r.Name] = r.Min
	}
	// mins is what a region without a share in the allocation in force
	// enforces: its safe share there if listed, else only a minimum the
	// policy names for it explicitly (a default minimum is granted by an
	// allocation, never assumed). A region joining late therefore starts
	// from mins(region), and the shrink epoch gives it no more.
	mins := func(region string) float64 {
		if cur != nil {
			if v, ok := cur.Safe[region]; ok {
				return v
			}
		}
		return p.MinShare[region]
	}
	a := &etcdlayout.Allocation{
		Policy:      p.Name,
		Phase:       etcdlayout.PhaseStable,
		Default:     next.Default,
		Overrides:   next.Overrides,
		Safe:        safe,
		Overcommit:  p.Limits.Overcommit,
		PublishedAt: now,
	}
	if cur == nil {
		a.Epoch = 1
		a.Reason = "initial allocation: " + moves(nil, next.Default, pp.demand)
		pp.pub = a
		return pp
	}
	old := etcdlayout.Shares{Default: cur.Default, Overrides: cur.Overrides}
	if !changed(old, *next, mins) && maps.Equal(cur.Safe, safe) && cur.Overcommit == p.Limits.Overcommit {
		return pp
	}
	a.Epoch = cur.Epoch + 1
	why := moves(cur.Default, next.Default, pp.demand) + overrideNote(old, *next)
	if cfg.Protocol == ProtocolTwoStep && (pending || shrinks(old, *next, mins)) {
		low := lower(old, *next, mins)
		a.Phase = etcdlayout.PhaseShrink
		a.Target = next
		a.Default, a.Overrides = low.Default, low.Overrides
		a.Reason = "shrink first, grow after acknowledgements: " + why
	} else {
		a.Reason = why
	}
	pp.pub = a
	return pp
}

// coversLive says every live region has a share in a.
func coversLive(a *etcdlayout.Allocation, snap *snapshot) bool {
	for r := range snap.live {
		if _, ok := a.Default[r]; !ok {
			return false
		}
	}
	return true
}

// ackWait says why the growth after shrink epoch cur must wait, or "".
// A region has acknowledged an epoch when every registered node of it
// has; a node that lost its registration counts at its safe share only
// SkewMargin after this leader saw it vanish (or after this leader took
// over, for nodes that vanished before).
func ackWait(now time.Time, snap *snapshot, st *state, cfg *Config, cur *etcdlayout.Allocation) string {
	if !st.leadSince.IsZero() {
		if left := cfg.SkewMargin - now.Sub(st.leadSince); left > 0 {
			return fmt.Sprintf("waiting %v more after taking the lead: a node that left before may still hold older shares", left.Round(time.Millisecond))
		}
	}
	for _, r := range slices.Sorted(maps.Keys(cur.Default)) {
		if nodes, ok := snap.live[r]; ok {
			for _, n := range slices.Sorted(maps.Keys(nodes)) {
				if got := snap.acks[r][n].Epochs[cur.Policy]; got < cur.Epoch {
					return fmt.Sprintf("waiting for node %s of region %s to acknowledge epoch %d (it holds %d)", nodeName(n), r, cur.Epoch, got)
				}
			}
			if gone, ok := st.nodeGone[r]; ok {
				if left := cfg.SkewMargin - now.Sub(gone); left > 0 {
					return fmt.Sprintf("waiting %v more for a node of region %s, whose lease ended, to be at its safe share", left.Round(time.Millisecond), r)
				}
			}
			continue
		}
		since, ok := st.missingSince[r]
		if !ok {
			since = now
		}
		if left := cfg.SkewMargin - now.Sub(since); left > 0 {
			return fmt.Sprintf("waiting %v more for region %s, whose lease expired, to be at its safe share", left.Round(time.Millisecond), r)
		}
	}
	return ""
}

// nodeName names a node in messages; "" is a pre-node registration.
func nodeName(n string) string {
	if n == "" {
		return "(region key)"
	}
	return n
}

// proposal computes the default split and the subject overrides.
func proposal(snap *snapshot, st *state, cfg *Config, p *policy.Policy, cur *etcdlayout.Allocation, ctl etcdlayout.Control) (*etcdlayout.Shares, []allocator.Region, error) {
	names := make(map[string]bool)
	for r := range snap.live {
		names[r] = true
	}
	if cur != nil {
		for r := range cur.Default {
			names[r] = true
		}
	}
	// A region the policy names a minimum for may enforce that minimum
	// before it ever registers (it is all a node outside any allocation
	// enforces), so every allocation reserves it.
	for r := range p.MinShare {
		names[r] = true
	}
	sorted := slices.Sorted(maps.Keys(names))
	if len(sorted) == 0 {
		return nil, nil, errors.New("no regions")
	}
	if len(sorted) > MaxRegions {
		sorted = sorted[:MaxRegions]
	}
	params := allocator.Params{
		Algorithm:  cfg.Algorithm,
		Overcommit: p.Limits.Overcommit,
		MaxStep:    cfg.MaxStep,
		DeadBand:   cfg.DeadBand,
	}
	if cur == nil {
		// The first allocation replaces the regions' safe shares: no
		// region enforces anything above its minimum yet, so it jumps
		// straight to the target.
		params.MaxStep, params.DeadBand = 0, 0
	}
	base := make([]allocator.Region, len(sorted))
	for i, name := range sorted {
		r := allocator.Region{Name: name, Weight: 1, Min: p.MinShareFor(name)}
		if m, ok := ctl.Minimums[name]; ok {
			r.Min = m
		}
		if w, ok := ctl.Weights[name]; ok {
			r.Weight = w
		}
		if pin, ok := ctl.Pins[name]; ok {
			r.Pinned, r.Pin = true, pin
		}
		_, r.Live = snap.live[name]
		r.Current = r.Min
		if cur != nil {
			if s, ok := cur.Default[name]; ok {
				r.Current = s
			}
		}
		base[i] = r
	}
	regions := slices.Clone(base)
	for i := range regions {
		regions[i].Demand = st.demand[p.Name][regions[i].Name]
	}
	def, err := allocator.Split(params, regions)
	if err != nil {
		return nil, nil, fmt.Errorf("split policy %s: %w", p.Name, err)
	}
	out := &etcdlayout.Shares{Default: make(map[string]float64, len(sorted))}
	for i, name := range sorted {
		out.Default[name] = def[i]
	}
	// Pressured subjects, most demand first, at most MaxOverrides.
	type ranked struct {
		subject string
		total   float64
	}
	var subs []ranked
	for s, sd := range st.subjects[p.Name] {
		t := 0.0
		for _, v := range sd.demand {
			t += v
		}
		subs = append(subs, ranked{s, t})
	}
	sort.Slice(subs, func(i, j int) bool {
		if subs[i].total != subs[j].total {
			return subs[i].total > subs[j].total
		}
		return subs[i].subject < subs[j].subject
	})
	if len(subs) > cfg.MaxOverrides {
		subs = subs[:cfg.MaxOverrides]
	}
	for _, s := range subs {
		sd := st.subjects[p.Name][s.subject]
		rs := slices.Clone(base)
		for i := range rs {
			rs[i].Demand = sd.demand[rs[i].Name]
			if cur != nil {
				if o, ok := cur.Overrides[s.subject][rs[i].Name]; ok {
					rs[i].Current = o
				}
			}
		}
		shares, err := allocator.Split(params, rs)
		if err != nil {
			return nil, nil, fmt.Errorf("split policy %s subject %s: %w", p.Name, s.subject, err)
		}
		same := true
		for i := range shares {
			if math.Abs(shares[i]-def[i]) > 1e-9 {
				same = false
			}
		}
		if same {
			continue
		}
		if out.Overrides == nil {
			out.Overrides = make(map[string]map[string]float64)
		}
		m := make(map[string]float64, len(sorted))
		for i, name := range sorted {
			m[name] = shares[i]
		}
		out.Overrides[s.subject] = m
	}
	return out, regions, nil
}

// effective is the share region enforces for subject ("" = default) under
// s; a region without an entry enforces its minimum.
func effective(s etcdlayout.Shares, subject, region string, mins func(string) float64) float64 {
	if subject != "" {
		if v, ok := s.Overrides[subject][region]; ok {
			return v
		}
	}
	if v, ok := s.Default[region]; ok {
		return v
	}
	return mins(region)
}

// universe lists the subjects ("" first) and regions of a and b.
func universe(a, b etcdlayout.Shares) (subjects, regions []string) {
	ss := map[string]bool{"": true}
	rs := map[string]bool{}
	for _, s := range []etcdlayout.Shares{a, b} {
		for r := range s.Default {
			rs[r] = true
		}
		for sub, m := range s.Overrides {
			ss[sub] = true
			for r := range m {
				rs[r] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(ss)), slices.Sorted(maps.Keys(rs))
}

func changed(old, next etcdlayout.Shares, mins func(string) float64) bool {
	if len(old.Overrides) != len(next.Overrides) || len(old.Default) != len(next.Default) {
		return true
	}
	subs, regs := universe(old, next)
	for _, s := range subs {
		if s != "" {
			_, a := old.Overrides[s]
			_, b := next.Overrides[s]
			if a != b {
				return true
			}
		}
		for _, r := range regs {
			if math.Abs(effective(old, s, r, mins)-effective(next, s, r, mins)) > eq {
				return true
			}
		}
	}
	return false
}

func shrinks(old, next etcdlayout.Shares, mins func(string) float64) bool {
	subs, regs := universe(old, next)
	for _, s := range subs {
		for _, r := range regs {
			if effective(next, s, r, mins) < effective(old, s, r, mins)-eq {
				return true
			}
		}
	}
	return false
}

// lower is min(old, next) for the default and every subject of either.
func lower(old, next etcdlayout.Shares, mins func(string) float64) *etcdlayout.Shares {
	subs, regs := universe(old, next)
	out := &etcdlayout.Shares{Default: make(map[string]float64, len(regs))}
	for _, s := range subs {
		m := make(map[string]float64, len(regs))
		for _, r := range regs {
			m[r] = math.Min(effective(old, s, r, mins), effective(next, s, r, mins))
		}
		if s == "" {
			out.Default = m
			continue
		}
		if out.Overrides == nil {
			out.Overrides = make(map[string]map[string]float64)
		}
		out.Overrides[s] = m
	}
	return out
}

func cloneOverrides(o map[string]map[string]float64) map[string]map[string]float64 {
	if o == nil {
		return nil
	}
	c := make(map[string]map[string]float64, len(o))
	for s, m := range o {
		c[s] = maps.Clone(m)
	}
	return c
}

// moves describes the default shares that changed, for logs and Reason.
func moves(old, next map[string]float64, demand map[string]float64) string {
	var b strings.Builder
	for _, r := range slices.Sorted(maps.Keys(next)) {
		o, ok := old[r]
		if ok && math.Abs(o-next[r]) < 0.0005 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		if ok {
			fmt.Fprintf(&b, "%s %.3f→%.3f", r, o, next[r])
		} else {
			fmt.Fprintf(&b, "%s %.3f", r, next[r])
		}
		if d, ok := demand[r]; ok {
			fmt.Fprintf(&b, " (demand %.2f)", d)
		}
	}
	if b.Len() == 0 {
		return "default unchanged"
	}
	return b.String()
}

func overrideNote(old, next etcdlayout.Shares) string {
	added, removed := 0, 0
	for s := range next.Overrides {
		if _, ok := old.Overrides[s]; !ok {
			added++
		}
	}
	for s := range old.Overrides {
		if _, ok := next.Overrides[s]; !ok {
			removed++
		}
	}
	if len(next.Overrides) == 0 && removed == 0 {
		return ""
	}
	return fmt.Sprintf("; %d subject overrides (+%d -%d)", len(next.Overrides), added, removed)
}
