package plan

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/quotacoord/quota/allocator"
)

// eq is the tolerance under which two shares are the same.
const eq = 1e-12

// Decision is the outcome of a round for one policy.
type Decision struct {
	Policy string
	// Publish is the allocation to publish, nil when nothing moves.
	Publish *Allocation
	// Proposal is the computed split, also when it is not published (nil
	// when the round did not compute one).
	Proposal *Shares
	// Demand is the smoothed demand per region fed to the allocator.
	Demand map[string]float64
	// Note says why nothing is published (growth waiting, frozen, an
	// error), if so.
	Note string
	// Waiting says a shrink's growth waits; WaitUntil is when the wait can
	// end by time alone (a skew margin running out), zero when it waits
	// for an acknowledgement or a lease to end.
	Waiting   bool
	WaitUntil time.Time
	// Deferred is set when a full round found a shrink still waiting and
	// planned nothing on the demand it read (see Settle).
	Deferred bool
	// Missed lists the nodes ("region/node") whose acknowledgement the
	// growth stopped waiting for at the deadline (Params.AckDeadline):
	// they count at their safe shares, to which they fell back.
	Missed []string
	// Mismatched lists the live regions the split did not count as live
	// (View.Mismatched): they get their minimum until their nodes agree.
	Mismatched []string
}

// Plan computes one round for policy p, whose allocation in force is cur
// (nil: none yet) and whose operator controls are ctl. A full round plans
// the split; other rounds (on an acknowledgement, a registration change, a
// recheck) only finish a pending shrink, or plan when a live region has no
// share yet. Plan reads l and changes nothing; Observe and Track are the
// only writers of the demand and registrations it reads.
func (l *Leader) Plan(now time.Time, v *View, p Policy, cur *Allocation, ctl Control, full bool) Decision {
	d := Decision{Policy: p.Name}
	if cur != nil && cur.Phase == PhaseShrink && cur.Target != nil && coversLive(cur, v) {
		why, until, missed := l.ackWait(now, v, cur)
		if why != "" {
			d.Note, d.Waiting, d.WaitUntil, d.Deferred = why, true, until, full
			return d
		}
		d.Missed = missed
		d.Publish = &Allocation{
			Policy:      p.Name,
			Epoch:       cur.Epoch + 1,
			Phase:       PhaseStable,
			Default:     maps.Clone(cur.Target.Default),
			Overrides:   cloneOverrides(cur.Target.Overrides),
			Safe:        maps.Clone(grownSafe(cur)),
			Held:        maps.Clone(cur.Held),
			Overcommit:  cur.Overcommit,
			PublishedAt: now,
			Reason: fmt.Sprintf("grow to the target of epoch %d: every region acknowledged it or lost its lease; %s",
				cur.Epoch, moves(cur.Default, cur.Target.Default, nil)),
			// The target was planned from the shrink's demand.
			Demand:        cur.Demand,
			SubjectDemand: cur.SubjectDemand,
		}
		return d
	}
	if ctl.Frozen {
		d.Note = "frozen by an operator"
		return d
	}
	// pending: cur is a shrink epoch whose growth has not been published.
	// Regions that did not acknowledge it may still enforce the epoch
	// before it, whose shares the record does not hold, so whatever
	// replaces it must again be a shrink from cur (each region's shares
	// only go down from what it may be enforcing) and grow only after
	// every region acknowledged that.
	pending := cur != nil && cur.Phase == PhaseShrink
	// Rounds that are not full also plan when a live region has no share
	// yet (or nothing was ever published): the plan must include it
	// before anyone grows.
	if !full && cur != nil && coversLive(cur, v) {
		return d
	}
	held := l.held(now, v, p.Name, cur)
	d.Mismatched = l.mismatched
	if l.tracked != v {
		d.Mismatched = v.Mismatched() // a view Track has not seen
	}
	subjects := l.ranked(p.Name)
	next, regions, safe, err := l.proposal(v, &p, cur, ctl, held, d.Mismatched, subjects)
	if err != nil {
		d.Note = err.Error()
		return d
	}
	d.Proposal = next
	d.Demand = make(map[string]float64, len(regions))
	for _, r := range regions {
		d.Demand[r.Name] = r.Demand
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
	a := &Allocation{
		Policy:      p.Name,
		Phase:       PhaseStable,
		Default:     next.Default,
		Overrides:   next.Overrides,
		Safe:        safe,
		Held:        held,
		Overcommit:  p.Overcommit,
		PublishedAt: now,
	}
	if cur == nil {
		a.Epoch = 1
		a.Reason = "initial allocation: " + moves(nil, next.Default, d.Demand)
		l.record(a, p.Name, subjects)
		d.Publish = a
		return d
	}
	old := Shares{Default: cur.Default, Overrides: cur.Overrides}
	if !Changed(old, *next, mins) && maps.Equal(cur.Safe, safe) && cur.Overcommit == p.Overcommit {
		return d
	}
	a.Epoch = cur.Epoch + 1
	why := moves(cur.Default, next.Default, d.Demand) + overrideNote(old, *next)
	if l.params.Protocol == TwoStep && (pending || Shrinks(old, *next, mins)) {
		low := Lower(old, *next, mins)
		a.Phase = PhaseShrink
		a.Target = next
		// A raised safe share waits for the growth: a region that falls
		// back before the others shrank must not take more than before.
		a.Safe, a.TargetSafe = lowerSafe(cur.Safe, safe), safe
		a.Default, a.Overrides = low.Default, low.Overrides
		a.Reason = "shrink first, grow after acknowledgements: " + why
	} else {
		a.Reason = why
	}
	l.record(a, p.Name, subjects)
	d.Publish = a
	return d
}

// Idle says a round that is not full leaves a policy whose allocation in
// force is cur as it is (Plan returns no allocation and no note): cur is
// a stable epoch with a share for every live region. A caller may skip
// such policies in rounds that are not full.
func Idle(v *View, cur *Allocation) bool {
	return cur != nil && cur.Phase != PhaseShrink && coversLive(cur, v)
}

// coversLive says every live region has a share in a.
func coversLive(a *Allocation, v *View) bool {
	for r := range v.Regions {
		if _, ok := a.Default[r]; !ok {
			return false
		}
	}
	return true
}

// ackWait says why the growth after shrink epoch cur must wait (or "")
// and when the wait ends by time alone (zero: at an event). A region has
// acknowledged an epoch when every registered node of it has; a node that
// lost its registration counts at its safe share only SkewMargin after
// this leader saw it vanish (or after this leader took over, for nodes
// that vanished before).
func (l *Leader) ackWait(now time.Time, v *View, cur *Allocation) (why string, until time.Time, missed []string) {
	margin := l.params.SkewMargin
	if until := l.leadSince.Add(margin); until.After(now) {
		return fmt.Sprintf("waiting %v more after taking the lead: a node that left before may still hold older shares",
			until.Sub(now).Round(time.Millisecond)), until, nil
	}
	// A node past the acknowledgement deadline has fallen back by itself.
	var deadline time.Time
	if seen, ok := l.shrinkSeen[cur.Policy]; ok && seen.epoch == cur.Epoch && l.params.AckDeadline > 0 {
		deadline = seen.at.Add(l.params.AckDeadline + margin)
	}
	for _, r := range slices.Sorted(maps.Keys(cur.Default)) {
		if nodes, ok := v.Regions[r]; ok {
			for _, n := range slices.Sorted(maps.Keys(nodes)) {
				if got := nodes[n].Acked[cur.Policy]; got < cur.Epoch {
					if !deadline.IsZero() && !now.Before(deadline) {
						missed = append(missed, r+"/"+n)
						continue
					}
					return fmt.Sprintf("waiting for node %s of region %s to acknowledge epoch %d (it holds %d)", n, r, cur.Epoch, got), deadline, nil
				}
			}
			if gone, ok := l.nodeGone[r]; ok {
				if until := gone.Add(margin); until.After(now) {
					return fmt.Sprintf("waiting %v more for a node of region %s, whose lease ended, to be at its safe share",
						until.Sub(now).Round(time.Millisecond), r), until, nil
				}
			}
			continue
		}
		since, ok := l.missingSince[r]
		if !ok {
			since = now
		}
		if until := since.Add(margin); until.After(now) {
			return fmt.Sprintf("waiting %v more for region %s, whose lease expired, to be at its safe share",
				until.Sub(now).Round(time.Millisecond), r), until, nil
		}
	}
	return "", time.Time{}, missed
}

// proposal computes the default split and the overrides of subjects, the
// pressured subjects ranked (Leader.ranked).
func (l *Leader) proposal(v *View, p *Policy, cur *Allocation, ctl Control, held map[string]float64, mismatched, subjects []string) (*Shares, []allocator.Region, map[string]float64, error) {
	names := make(map[string]bool)
	for r := range v.Regions {
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
	// A retired region without a registered node leaves the allocation:
	// the operator said none of its nodes runs.
	for r := range v.Retired {
		if _, live := v.Regions[r]; !live {
			delete(names, r)
		}
	}
	sorted := slices.Sorted(maps.Keys(names))
	if len(sorted) == 0 {
		return nil, nil, nil, errors.New("no regions")
	}
	if len(sorted) > allocator.MaxRegions {
		sorted = sorted[:allocator.MaxRegions]
	}
	params := allocator.Params{
		Algorithm:  l.params.Algorithm,
		Overcommit: p.Overcommit,
		MaxStep:    l.params.MaxStep,
		DeadBand:   l.params.DeadBand,
	}
	if cur == nil {
		// The first allocation replaces the regions' safe shares: no
		// region enforces anything above its minimum yet, so it jumps
		// straight to the target.
		params.MaxStep, params.DeadBand = 0, 0
	}
	base := make([]allocator.Region, len(sorted))
	safe := make(map[string]float64, len(sorted))
	for i, name := range sorted {
		r := allocator.Region{Name: name, Weight: 1, Min: p.MinShareFor(name)}
		if m, ok := ctl.Minimums[name]; ok {
			r.Min = m
		}
		// The safe share published is the minimum; the split reserves
		// at least what the region may still hold from before.
		safe[name] = r.Min
		r.Min = max(r.Min, held[name])
		if w, ok := ctl.Weights[name]; ok {
			r.Weight = w
		}
		if pin, ok := ctl.Pins[name]; ok {
			r.Pinned, r.Pin = true, pin
		}
		// A region whose nodes disagree with the others on policies or
		// subject naming is not counted: it keeps its minimum.
		_, r.Live = v.Regions[name]
		r.Live = r.Live && !slices.Contains(mismatched, name)
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
		regions[i].Demand = l.demand[p.Name][regions[i].Name]
	}
	def, err := allocator.Split(params, regions)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("split policy %s: %w", p.Name, err)
	}
	out := &Shares{Default: make(map[string]float64, len(sorted))}
	for i, name := range sorted {
		out.Default[name] = def[i]
	}
	rs := slices.Clone(base)
	for _, subject := range subjects {
		sd := l.subjects[p.Name][subject]
		copy(rs, base)
		for i := range rs {
			rs[i].Demand = sd.demand[rs[i].Name]
			if cur != nil {
				if o, ok := cur.Overrides[subject][rs[i].Name]; ok {
					rs[i].Current = o
				}
			}
		}
		shares, err := allocator.Split(params, rs)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("split policy %s subject %s: %w", p.Name, subject, err)
		}
		same := true
		for i := range shares {
			if math.Abs(shares[i]-def[i]) > allocator.Tolerance {
				same = false
				break
			}
		}
		if same {
			continue // a split equal to the default needs no override
		}
		if out.Overrides == nil {
			out.Overrides = make(map[string]map[string]float64)
		}
		out.Overrides[subject] = sharesOf(sorted, shares, cur, subject)
	}
	return out, regions, safe, nil
}

// ranked are policy's pressured subjects a split considers: most demand
// first (ties in name order), at most MaxOverrides.
func (l *Leader) ranked(policy string) []string {
	type ranked struct {
		subject string
		total   float64
	}
	var subs []ranked
	for s, sd := range l.subjects[policy] {
		subs = append(subs, ranked{s, sd.total()})
	}
	slices.SortFunc(subs, func(a, b ranked) int {
		if a.total != b.total {
			return cmp.Compare(b.total, a.total)
		}
		return strings.Compare(a.subject, b.subject)
	})
	out := make([]string, 0, min(len(subs), l.params.MaxOverrides))
	for _, s := range subs[:min(len(subs), l.params.MaxOverrides)] {
		out = append(out, s.subject)
	}
	return out
}

// held is, per region of cur, the largest safe share the region may fall
// back to: cur's own when every node of the region acknowledged cur (and
// none vanished since the leader last looked), else also the largest of
// the epochs before it that the region did not acknowledge.
func (l *Leader) held(now time.Time, v *View, policy string, cur *Allocation) map[string]float64 {
	if cur == nil {
		return nil
	}
	out := make(map[string]float64, len(cur.Safe))
	for r, s := range cur.Safe {
		out[r] = s
		// Only a region held above its safe share needs its nodes'
		// acknowledgements looked at (nodes × policies lookups a round).
		if h := cur.Held[r]; h > s && !l.acknowledged(now, v, policy, r, cur.Epoch) {
			out[r] = h
		}
	}
	return out
}

// acknowledged says every registered node of region acknowledged epoch
// of policy, none of its nodes vanished in the last skew margin, and none
// that vanished before acknowledging epoch is still away (Leader.behind:
// cut off, it enforces the safe share of the epoch it last applied).
func (l *Leader) acknowledged(now time.Time, v *View, policy, region string, epoch uint64) bool {
	nodes, ok := v.Regions[region]
	if !ok {
		return false
	}
	for _, n := range nodes {
		if n.Acked[policy] < epoch {
			return false
		}
	}
	for _, acked := range l.behind[region] {
		if acked[policy] < epoch {
			return false
		}
	}
	gone, ok := l.nodeGone[region]
	return !ok || !gone.Add(l.params.SkewMargin).After(now)
}

// grownSafe is the safe share the growth after cur publishes.
func grownSafe(cur *Allocation) map[string]float64 {
	if cur.TargetSafe != nil {
		return cur.TargetSafe
	}
	return cur.Safe
}

// lowerSafe is min(a, b) per region of b; a region only b names keeps
// b's.
func lowerSafe(a, b map[string]float64) map[string]float64 {
	out := maps.Clone(b)
	for r, s := range out {
		if o, ok := a[r]; ok {
			out[r] = math.Min(o, s)
		}
	}
	return out
}

// sharesOf maps regions to shares, reusing subject's override in cur when
// it holds exactly these (allocations are never changed once built, so
// they may share a map; a round that moves nothing then allocates none).
func sharesOf(regions []string, shares []float64, cur *Allocation, subject string) map[string]float64 {
	if cur != nil {
		if o, ok := cur.Overrides[subject]; ok && len(o) == len(regions) {
			same := true
			for i, r := range regions {
				if v, ok := o[r]; !ok || v != shares[i] {
					same = false
					break
				}
			}
			if same {
				return o
			}
		}
	}
	m := make(map[string]float64, len(regions))
	for i, r := range regions {
		m[r] = shares[i]
	}
	return m
}

// Effective is the share region enforces for subject ("" = the default)
// under s; a region without an entry enforces mins(region).
func Effective(s Shares, subject, region string, mins func(string) float64) float64 {
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

// eachUnit calls fn for every subject ("" = the default) and region
// whose share a or b sets: the subjects of either, and the regions of
// either's default and overrides. A pair may be visited more than once.
// It allocates nothing while the regions fit in a small buffer.
func eachUnit(a, b Shares, fn func(subject, region string)) {
	var buf [16]string
	regions := buf[:0]
	for r := range a.Default {
		regions = append(regions, r)
	}
	for r := range b.Default {
		if _, ok := a.Default[r]; !ok {
			regions = append(regions, r)
		}
	}
	inDefault := func(r string) bool {
		_, x := a.Default[r]
		_, y := b.Default[r]
		return x || y
	}
	for _, s := range []Shares{a, b} {
		for _, m := range s.Overrides {
			for r := range m {
				if !inDefault(r) && !slices.Contains(regions, r) {
					regions = append(regions, r) // a region only an override names
				}
			}
		}
	}
	for _, r := range regions {
		fn("", r)
	}
	for subject := range a.Overrides {
		for _, r := range regions {
			fn(subject, r)
		}
	}
	for subject := range b.Overrides {
		if _, ok := a.Overrides[subject]; ok {
			continue
		}
		for _, r := range regions {
			fn(subject, r)
		}
	}
}

// Changed says whether next differs from old: another set of overrides or
// regions, or a share (default or subject) that moved by more than 1e-12.
// It allocates nothing: a full round asks it every time.
func Changed(old, next Shares, mins func(string) float64) bool {
	if len(old.Overrides) != len(next.Overrides) || len(old.Default) != len(next.Default) {
		return true
	}
	// Equal lengths: the same regions when every one of next is in old.
	for r, v := range next.Default {
		o, ok := old.Default[r]
		if !ok || math.Abs(o-v) > eq {
			return true
		}
	}
	for s, m := range next.Overrides {
		om, ok := old.Overrides[s]
		if !ok {
			return true
		}
		// A region in neither the default nor the subject's maps enforces
		// mins in both.
		for _, regions := range []map[string]float64{next.Default, m, om} {
			for r := range regions {
				if math.Abs(Effective(old, s, r, mins)-Effective(next, s, r, mins)) > eq {
					return true
				}
			}
		}
	}
	return false
}

// Shrinks says whether some share (the default, or a subject's with an
// override in either) is lower in next than in old by more than 1e-12:
// then the two-step protocol publishes Lower first.
func Shrinks(old, next Shares, mins func(string) float64) bool {
	shrinks := false
	eachUnit(old, next, func(s, r string) {
		if !shrinks && Effective(next, s, r, mins) < Effective(old, s, r, mins)-eq {
			shrinks = true
		}
	})
	return shrinks
}

// Lower is min(old, next) for the default and every subject of either.
func Lower(old, next Shares, mins func(string) float64) *Shares {
	out := &Shares{Default: make(map[string]float64, len(next.Default))}
	eachUnit(old, next, func(s, r string) {
		m := out.Default
		if s != "" {
			if out.Overrides == nil {
				out.Overrides = make(map[string]map[string]float64, len(old.Overrides)+len(next.Overrides))
			}
			if m = out.Overrides[s]; m == nil {
				m = make(map[string]float64, len(next.Default))
				out.Overrides[s] = m
			}
		}
		m[r] = math.Min(Effective(old, s, r, mins), Effective(next, s, r, mins))
	})
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

func overrideNote(old, next Shares) string {
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
