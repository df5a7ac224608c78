package plan

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/allocator"
)

var t0 = time.Unix(1_700_000_000, 0)

// params are the rules the tests plan with (rebalance's defaults).
func params() Params {
	return Params{Algorithm: allocator.MaxMinFair, MaxStep: 0.3, DeadBand: 0.01, Alpha: 0.5, Protocol: TwoStep,
		MaxOverrides: 64, OverrideRounds: 3, SkewMargin: 2 * time.Second}
}

// exports is a policy of 600 per minute with a default minimum of 0.05.
var exports = Policy{Name: "exports", Rate: 10, DefaultMinShare: 0.05}

func leader(t *testing.T, p Params, since time.Time) *Leader {
	t.Helper()
	l, err := NewLeader(p, since)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// nodes returns a view of regions with one node "n" each, acknowledging
// acked[region] of policy exports (absent: nothing).
func nodes(acked map[string]uint64, regions ...string) *View {
	v := &View{Regions: map[string]map[string]Node{}, Demand: map[string]map[string]PolicyDemand{}}
	for _, r := range regions {
		n := Node{}
		if e, ok := acked[r]; ok {
			n.Acked = map[string]uint64{"exports": e}
		}
		v.Regions[r] = map[string]Node{"n": n}
	}
	return v
}

func offered(v *View, region string, o float64, pressured ...SubjectDemand) {
	v.Demand[region] = map[string]PolicyDemand{"exports": {Offered: o, Pressured: pressured}}
}

func sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

func TestParamsValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Params)
		want string
	}{
		{"valid", func(*Params) {}, ""},
		{"alpha 0", func(p *Params) { p.Alpha = 0 }, "Alpha"},
		{"alpha NaN", func(p *Params) { p.Alpha = math.NaN() }, "Alpha"},
		{"alpha above 1", func(p *Params) { p.Alpha = 1.5 }, "Alpha"},
		{"protocol", func(p *Params) { p.Protocol = "three-step" }, "protocol"},
		{"overrides", func(p *Params) { p.MaxOverrides = MaxOverridesLimit + 1 }, "MaxOverrides"},
		{"override rounds", func(p *Params) { p.OverrideRounds = 0 }, "OverrideRounds"},
		{"skew", func(p *Params) { p.SkewMargin = -time.Second }, "SkewMargin"},
		{"algorithm", func(p *Params) { p.Algorithm = "lottery" }, "lottery"},
	}
	for _, c := range cases {
		p := params()
		c.edit(&p)
		err := p.Validate()
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// TestRoundSteps is the step table of one policy's rounds over time: the
// first allocation, a move toward demand in two steps, the growth held
// until every region acknowledged, and a round that is not full leaving a
// stable allocation alone.
func TestRoundSteps(t *testing.T) {
	l := leader(t, params(), t0.Add(-time.Hour))
	var cur *Allocation
	acked := map[string]uint64{}
	type step struct {
		name      string
		at        time.Duration
		full      bool
		demand    map[string]float64 // offered per region (nil: no reports this round)
		ack       bool               // every region acknowledges cur before the round
		wantPhase Phase              // "" : nothing published
		wantWait  bool
		check     func(t *testing.T, a *Allocation)
	}
	steps := []step{
		{name: "first allocation follows demand at once", full: true, demand: map[string]float64{"a": 30, "b": 10},
			wantPhase: PhaseStable, check: func(t *testing.T, a *Allocation) {
				if a.Epoch != 1 || a.Default["a"] <= a.Default["b"] || math.Abs(sum(a.Default)-1) > 1e-9 {
					t.Errorf("epoch 1: %+v", a.Default)
				}
			}},
		{name: "an acknowledgement round changes nothing", at: time.Second, ack: true},
		{name: "demand moves to b: shrink a first", at: 5 * time.Second, full: true, demand: map[string]float64{"a": 1, "b": 40},
			wantPhase: PhaseShrink, check: func(t *testing.T, a *Allocation) {
				if a.Target == nil || a.Target.Default["b"] <= a.Default["b"] {
					t.Errorf("shrink epoch without growth ahead: %+v", a)
				}
				if s := sum(a.Default); s > 1+1e-9 {
					t.Errorf("shrink epoch sums to %v", s)
				}
			}},
		{name: "growth waits for the acknowledgements", at: 6 * time.Second, wantWait: true},
		{name: "a full round over the waiting shrink is deferred", at: 10 * time.Second, full: true, demand: map[string]float64{"a": 1, "b": 40}, wantWait: true},
		{name: "every region acknowledged: grow", at: 11 * time.Second, ack: true, wantPhase: PhaseStable, check: func(t *testing.T, a *Allocation) {
			if a.Default["b"] <= 0.5 {
				t.Errorf("b did not grow: %v", a.Default)
			}
		}},
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		if s.ack && cur != nil {
			acked["a"], acked["b"] = cur.Epoch, cur.Epoch
		}
		v := nodes(acked, "a", "b")
		for r, o := range s.demand {
			offered(v, r, o)
		}
		allocs := map[string]*Allocation{"exports": cur}
		l.Track(now, v, allocs)
		if s.full {
			l.Observe(v, []Policy{exports})
		}
		d := l.Plan(now, v, exports, cur, Control{}, s.full)
		switch {
		case s.wantPhase == "" && d.Publish != nil:
			t.Fatalf("%s: published %+v", s.name, d.Publish)
		case s.wantPhase != "" && (d.Publish == nil || d.Publish.Phase != s.wantPhase):
			t.Fatalf("%s: published %+v (note %q), want phase %s", s.name, d.Publish, d.Note, s.wantPhase)
		case d.Waiting != s.wantWait:
			t.Fatalf("%s: waiting %v (%q), want %v", s.name, d.Waiting, d.Note, s.wantWait)
		case d.Deferred != (s.wantWait && s.full):
			t.Fatalf("%s: deferred %v", s.name, d.Deferred)
		}
		if s.check != nil {
			s.check(t, d.Publish)
		}
		if d.Publish != nil {
			if cur != nil && d.Publish.Epoch != cur.Epoch+1 {
				t.Fatalf("%s: epoch %d after %d", s.name, d.Publish.Epoch, cur.Epoch)
			}
			cur = d.Publish
		}
	}
}

// TestPlanOverPendingShrinkShrinksAgain: a region registers while a
// shrink epoch waits for c's acknowledgement. The new plan (which must
// include the new region) may not publish growth: c may still enforce the
// epoch before the shrink, whose shares the shrink record does not hold.
// It publishes another shrink from the pending one.
func TestPlanOverPendingShrinkShrinksAgain(t *testing.T) {
	cur := &Allocation{
		Policy: "exports", Epoch: 2, Phase: PhaseShrink,
		Default: map[string]float64{"a": 0.2, "b": 0.2, "c": 0.2},
		Target:  &Shares{Default: map[string]float64{"a": 0.2, "b": 0.6, "c": 0.2}},
		Safe:    map[string]float64{"a": 0.05, "b": 0.05, "c": 0.05},
	}
	v := nodes(map[string]uint64{"a": 2, "b": 2, "c": 1}, "a", "b", "c", "d")
	l := leader(t, params(), t0.Add(-time.Hour))
	l.demand["exports"] = map[string]float64{"a": 0.2, "b": 0.6, "c": 0.2, "d": 0}
	for _, full := range []bool{false, true} {
		d := l.Plan(t0, v, exports, cur, Control{}, full)
		pub := d.Publish
		if pub == nil || pub.Phase != PhaseShrink || pub.Target == nil || pub.Epoch != 3 {
			t.Fatalf("full=%v: over a pending shrink got %+v (%q), want shrink epoch 3", full, pub, d.Note)
		}
		for r, s := range cur.Default {
			if pub.Default[r] > s+1e-12 {
				t.Errorf("full=%v: region %s grows %v → %v before c acknowledged", full, r, s, pub.Default[r])
			}
		}
		if _, ok := pub.Target.Default["d"]; !ok {
			t.Errorf("full=%v: target leaves out the new region d: %v", full, pub.Target.Default)
		}
		if s := sum(pub.Target.Default); s > 1+1e-9 {
			t.Errorf("full=%v: target sums to %v", full, s)
		}
	}
}

// TestAllocationReservesNamedMinimums: a region the policy names a minimum
// for enforces it outside any allocation, even before it ever registers,
// so the plan reserves it.
func TestAllocationReservesNamedMinimums(t *testing.T) {
	p := exports
	p.MinShare = map[string]float64{"eu": 0.3}
	l := leader(t, params(), t0)
	d := l.Plan(t0, nodes(nil, "us", "ap"), p, nil, Control{}, true)
	a := d.Publish
	if a == nil {
		t.Fatalf("want a publish, got %+v", d)
	}
	if a.Default["eu"] != 0.3 || a.Safe["eu"] != 0.3 {
		t.Fatalf("eu (named minimum 0.3, not registered) got share %v safe %v", a.Default["eu"], a.Safe["eu"])
	}
	if s := sum(a.Default); s > 1+1e-9 {
		t.Fatalf("shares sum to %v: %v", s, a.Default)
	}
}

// TestFrozenAndPinned: a frozen policy publishes nothing; a pin is
// published exactly, at once.
func TestFrozenAndPinned(t *testing.T) {
	cur := &Allocation{Policy: "exports", Epoch: 4, Phase: PhaseStable, Default: map[string]float64{"a": 0.5, "b": 0.5},
		Safe: map[string]float64{"a": 0.05, "b": 0.05}}
	v := nodes(map[string]uint64{"a": 4, "b": 4}, "a", "b")
	offered(v, "a", 40)
	l := leader(t, params(), t0.Add(-time.Hour))
	l.Observe(v, []Policy{exports})
	if d := l.Plan(t0, v, exports, cur, Control{Frozen: true}, true); d.Publish != nil || d.Note != "frozen by an operator" {
		t.Fatalf("frozen: %+v", d)
	}
	d := l.Plan(t0, v, exports, cur, Control{Pins: map[string]float64{"b": 0.9}}, true)
	if d.Publish == nil || d.Publish.Phase != PhaseShrink || d.Publish.Target.Default["b"] != 0.9 {
		t.Fatalf("pinned b at 0.9: %+v", d.Publish)
	}
}

// TestNaivePublishesAtOnce: the naive protocol publishes a move in one
// stable epoch.
func TestNaivePublishesAtOnce(t *testing.T) {
	p := params()
	p.Protocol = Naive
	cur := &Allocation{Policy: "exports", Epoch: 1, Phase: PhaseStable, Default: map[string]float64{"a": 0.5, "b": 0.5},
		Safe: map[string]float64{"a": 0.05, "b": 0.05}}
	v := nodes(nil, "a", "b")
	offered(v, "b", 40)
	l := leader(t, p, t0)
	l.Observe(v, []Policy{exports})
	d := l.Plan(t0, v, exports, cur, Control{}, true)
	if d.Publish == nil || d.Publish.Phase != PhaseStable || d.Publish.Default["b"] <= 0.5 {
		t.Fatalf("naive move: %+v", d.Publish)
	}
}

// TestObserve is the step table of demand smoothing: each region's share
// of the offered load, smoothed once per round, the first observation
// taken as it is and only from a report; pressured subjects' demand over
// the policy's rate, decaying without reports and forgotten after
// OverrideRounds rounds; bounds on the subjects read and kept.
func TestObserve(t *testing.T) {
	p := params()
	p.MaxOverrides, p.OverrideRounds = 2, 3
	l := leader(t, p, t0)
	pol := []Policy{{Name: "exports", Rate: 10}}
	near := func(what string, got map[string]float64, want map[string]float64) {
		t.Helper()
		for r, w := range want {
			if math.Abs(got[r]-w) > 1e-12 {
				t.Errorf("%s = %v, want %v", what, got, want)
				return
			}
		}
	}
	subject := func(s string) map[string]float64 {
		_, subs := l.Demand("exports")
		return subs[s]
	}
	sd := func(s string, o float64) SubjectDemand { return SubjectDemand{Subject: s, Offered: o} }

	// Round 1: a and b reported, c not. First observations as they are.
	v := nodes(nil, "a", "b", "c")
	offered(v, "a", 30, sd("s5", 20))
	offered(v, "b", 10)
	l.Observe(v, pol)
	d, _ := l.Demand("exports")
	near("round 1", d, map[string]float64{"a": 0.75, "b": 0.25})
	if _, ok := d["c"]; ok {
		t.Error("c got a first observation without a report")
	}
	near("round 1 subject s5", subject("s5"), map[string]float64{"a": 2})

	// Round 2: demand moves to b, smoothed once with α = 0.5.
	offered(v, "a", 10)
	offered(v, "b", 30, sd("s5", 10))
	l.Observe(v, pol)
	d, _ = l.Demand("exports")
	near("round 2", d, map[string]float64{"a": 0.5, "b": 0.5})
	near("round 2 subject s5", subject("s5"), map[string]float64{"a": 1, "b": 0.5})

	// Rounds 3 to 5: nobody names s5; it decays and is gone after
	// OverrideRounds rounds.
	offered(v, "b", 30)
	l.Observe(v, pol)
	near("round 3 subject s5", subject("s5"), map[string]float64{"a": 0.5, "b": 0.25})
	l.Observe(v, pol)
	l.Observe(v, pol)
	if subject("s5") != nil {
		t.Errorf("s5 kept after %d rounds without reports: %v", p.OverrideRounds, subject("s5"))
	}

	// Bounds: at most MaxOverrides subjects per report are read, at most
	// 2·MaxOverrides kept, new ones taken in region order, then report
	// order.
	offered(v, "a", 10, sd("s1", 9), sd("s2", 8), sd("s3", 7))
	offered(v, "b", 10, sd("s4", 9), sd("s6", 8))
	offered(v, "c", 10, sd("s7", 9), sd("s8", 8))
	l.Observe(v, pol)
	for _, s := range []string{"s1", "s2", "s4", "s6"} {
		if subject(s) == nil {
			t.Errorf("subject %s not tracked", s)
		}
	}
	for _, s := range []string{"s3", "s7", "s8"} {
		if subject(s) != nil {
			t.Errorf("subject %s tracked beyond the bounds", s)
		}
	}

	// A region without a registered node loses its demand; the rest is
	// observed without it.
	prev, _ := l.Demand("exports")
	delete(v.Regions, "c")
	delete(v.Demand, "c")
	l.Observe(v, pol)
	d, _ = l.Demand("exports")
	if _, ok := d["c"]; ok {
		t.Error("c's demand outlived its registration")
	}
	near("without c", d, map[string]float64{"a": prev["a"] + 0.5*(0.5-prev["a"]), "b": prev["b"] + 0.5*(0.5-prev["b"])})

	// A policy no longer defined is forgotten.
	l.Observe(v, nil)
	if d, s := l.Demand("exports"); d != nil || s != nil {
		t.Errorf("demand of a removed policy kept: %v %v", d, s)
	}
}

// TestFirstObservationComesFromAReport: a live region without a demand
// report gets no smoothed demand and stays "returned"; its first report is
// then taken as it is, not smoothed up from 0.
func TestFirstObservationComesFromAReport(t *testing.T) {
	l := leader(t, params(), t0)
	allocs := map[string]*Allocation{"exports": {Default: map[string]float64{"a": 0.4, "b": 0.4, "c": 0.2}}}
	l.Track(t0, nodes(nil, "a", "b"), allocs)
	if _, ok := l.MissingSince("c"); !ok {
		t.Fatal("c, in the allocation without a node, not noted missing")
	}
	v := nodes(nil, "a", "b", "c")
	l.Track(t0.Add(time.Second), v, allocs)
	if !l.Returned("c") {
		t.Fatal("c not noted back")
	}
	offered(v, "a", 10)
	offered(v, "b", 10)
	l.Observe(v, []Policy{exports})
	if d, _ := l.Demand("exports"); d["c"] != 0 {
		t.Fatalf("c has demand %v before any report", d["c"])
	}
	if !l.Returned("c") {
		t.Fatal("c no longer counted as back before any report")
	}
	offered(v, "c", 20)
	l.Observe(v, []Policy{exports})
	if d, _ := l.Demand("exports"); d["c"] != 0.5 {
		t.Fatalf("c's first observation %v, want 0.5 (20 of 40, as it is)", d["c"])
	}
	if l.Returned("c") {
		t.Fatal("c still counted as back after a round observed its report")
	}
}

// TestReportArrived: the first report of a region back from having no
// node is worth a full round, once.
func TestReportArrived(t *testing.T) {
	l := leader(t, params(), t0)
	allocs := map[string]*Allocation{"exports": {Default: map[string]float64{"a": 0.5, "c": 0.5}}}
	l.Track(t0, nodes(nil, "a"), allocs)
	if l.ReportArrived("a") || l.ReportArrived("c") {
		t.Fatal("a full round for a region that never left, or is still gone")
	}
	l.Track(t0.Add(time.Second), nodes(nil, "a", "c"), allocs)
	if !l.ReportArrived("c") {
		t.Fatal("no full round at c's first report")
	}
	if l.ReportArrived("c") {
		t.Fatal("a second full round at c's next report")
	}
}

// TestSettle is the step table of the follow-up rule: a full round that
// found a shrink waiting is owed; the round that publishes the growth is
// followed by a full round at once unless it was one.
func TestSettle(t *testing.T) {
	l := leader(t, params(), t0)
	steps := []struct {
		full, deferred, published bool
		want                      bool
	}{
		{full: false, published: true, want: false}, // nothing owed
		{full: true, deferred: true, want: false},   // owed from here
		{full: false, deferred: false, published: false, want: false},
		{full: false, published: true, want: true}, // the growth: a full round now
		{full: false, published: true, want: false},
		{full: true, deferred: true, want: false},
		{full: true, published: true, want: false}, // a full round grew: nothing more
		{full: false, published: true, want: false},
	}
	for i, s := range steps {
		if got := l.Settle(s.full, s.deferred, s.published); got != s.want {
			t.Fatalf("step %d %+v: full round now %v, want %v", i, s, got, s.want)
		}
	}
}

// TestAckWaitNodes is the step table of the growth's wait for regions of
// several nodes: every registered node must acknowledge; a node that
// vanished, or a leadership change, holds growth for the skew margin.
func TestAckWaitNodes(t *testing.T) {
	now := t0
	cur := &Allocation{Policy: "exports", Epoch: 5, Phase: PhaseShrink,
		Default: map[string]float64{"a": 0.4, "b": 0.4}, Target: &Shares{Default: map[string]float64{"a": 0.6, "b": 0.4}}}
	ack := func(e uint64) Node { return Node{Acked: map[string]uint64{"exports": e}} }
	view := func(a map[string]Node, b map[string]Node) *View {
		return &View{Regions: map[string]map[string]Node{"a": a, "b": b}}
	}
	all := view(map[string]Node{"1": ack(5), "2": ack(6)}, map[string]Node{"1": ack(5)})
	cases := []struct {
		name  string
		v     *View
		since time.Time
		gone  time.Time // a node of a vanished then (zero: none)
		wait  bool
		until time.Time
	}{
		{"every node acked", all, now.Add(-time.Hour), time.Time{}, false, time.Time{}},
		{"one node of a behind", view(map[string]Node{"1": ack(5), "2": ack(4)}, map[string]Node{"1": ack(5)}), now.Add(-time.Hour), time.Time{}, true, time.Time{}},
		{"one node of a without an ack", view(map[string]Node{"1": ack(5), "2": {}}, map[string]Node{"1": ack(5)}), now.Add(-time.Hour), time.Time{}, true, time.Time{}},
		{"a node of a vanished 1s ago", all, now.Add(-time.Hour), now.Add(-time.Second), true, now.Add(time.Second)},
		{"a node of a vanished 3s ago", all, now.Add(-time.Hour), now.Add(-3 * time.Second), false, time.Time{}},
		{"leading for 1s", all, now.Add(-time.Second), time.Time{}, true, now.Add(time.Second)},
		{"leading for 3s", all, now.Add(-3 * time.Second), time.Time{}, false, time.Time{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := leader(t, params(), c.since)
			if !c.gone.IsZero() {
				l.NodeGone("a", c.gone)
			}
			d := l.Plan(now, c.v, exports, cur, Control{}, false)
			if d.Waiting != c.wait || !d.WaitUntil.Equal(c.until) {
				t.Fatalf("waiting %v until %v (%q), want %v until %v", d.Waiting, d.WaitUntil, d.Note, c.wait, c.until)
			}
			if !c.wait && (d.Publish == nil || d.Publish.Epoch != 6 || d.Publish.Default["a"] != 0.6) {
				t.Fatalf("growth not published: %+v", d.Publish)
			}
		})
	}
}

// TestAckWaitMissingRegion: a region of the allocation without any node
// counts at its safe share a skew margin after the leader saw it gone.
func TestAckWaitMissingRegion(t *testing.T) {
	cur := &Allocation{Policy: "exports", Epoch: 5, Phase: PhaseShrink,
		Default: map[string]float64{"a": 0.4, "b": 0.4}, Target: &Shares{Default: map[string]float64{"a": 0.6, "b": 0.4}}}
	allocs := map[string]*Allocation{"exports": cur}
	l := leader(t, params(), t0.Add(-time.Hour))
	v := nodes(map[string]uint64{"a": 5}, "a")
	l.Track(t0, v, allocs)
	if d := l.Plan(t0.Add(time.Second), v, exports, cur, Control{}, false); !d.Waiting || !d.WaitUntil.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("1s after b went missing: %+v", d)
	}
	if d := l.Plan(t0.Add(2*time.Second), v, exports, cur, Control{}, false); d.Publish == nil {
		t.Fatalf("a skew margin after b went missing: %+v", d)
	}
}

// TestTrackNodes: a node that drops out of the registrations between two
// views is noted as gone for its region, which holds growth there.
func TestTrackNodes(t *testing.T) {
	l := leader(t, params(), t0.Add(-time.Hour))
	two := &View{Regions: map[string]map[string]Node{"a": {"1": {}, "2": {}}}}
	one := &View{Regions: map[string]map[string]Node{"a": {"1": {}}}}
	l.Track(t0, two, nil)
	if len(l.nodeGone) != 0 {
		t.Fatalf("nothing vanished yet: %v", l.nodeGone)
	}
	l.Track(t0.Add(time.Second), one, nil)
	if got, ok := l.nodeGone["a"]; !ok || !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("node a/2 vanished at +1s: %v", l.nodeGone)
	}
}

// TestChangedAndShrinks: only a change beyond 1e-12 is published, and only
// one that lowers some share (the default, or a subject's in either
// allocation) needs a shrink epoch.
func TestChangedAndShrinks(t *testing.T) {
	sh := func(def []float64, ovr map[string][]float64) Shares {
		s := Shares{Default: map[string]float64{"a": def[0], "b": def[1]}}
		for subj, o := range ovr {
			if s.Overrides == nil {
				s.Overrides = map[string]map[string]float64{}
			}
			s.Overrides[subj] = map[string]float64{"a": o[0], "b": o[1]}
		}
		return s
	}
	none := func(string) float64 { return 0 }
	cases := []struct {
		name            string
		a, b            Shares
		changed, shrink bool
	}{
		{"same", sh([]float64{0.5, 0.5}, nil), sh([]float64{0.5, 0.5 + 1e-13}, nil), false, false},
		{"default grows", sh([]float64{0.4, 0.4}, nil), sh([]float64{0.5, 0.5}, nil), true, false},
		{"default moves", sh([]float64{0.5, 0.5}, nil), sh([]float64{0.6, 0.4}, nil), true, true},
		{"override above the default", sh([]float64{0.4, 0.4}, nil), sh([]float64{0.4, 0.4}, map[string][]float64{"s": {0.6, 0.4}}), true, false},
		{"override below the default", sh([]float64{0.5, 0.5}, nil), sh([]float64{0.5, 0.5}, map[string][]float64{"s": {0.9, 0.1}}), true, true},
		{"override dropped, default higher", sh([]float64{0.5, 0.5}, map[string][]float64{"s": {0.2, 0.2}}), sh([]float64{0.5, 0.5}, nil), true, false},
		{"override dropped, default lower", sh([]float64{0.5, 0.5}, map[string][]float64{"s": {0.9, 0.1}}), sh([]float64{0.5, 0.5}, nil), true, true},
	}
	for _, c := range cases {
		if got := Changed(c.a, c.b, none); got != c.changed {
			t.Errorf("%s: Changed %v, want %v", c.name, got, c.changed)
		}
		if got := Shrinks(c.a, c.b, none); got != c.shrink {
			t.Errorf("%s: Shrinks %v, want %v", c.name, got, c.shrink)
		}
		low := Lower(c.a, c.b, none)
		for _, r := range []string{"a", "b"} {
			if want := math.Min(c.a.Default[r], c.b.Default[r]); low.Default[r] != want {
				t.Errorf("%s: Lower default %s = %v, want %v", c.name, r, low.Default[r], want)
			}
		}
	}
}

// safeCAt03 is epoch 3 of exports, where c holds and falls back to 0.3,
// and a leader without step limit that took over an hour before t0.
func safeCAt03(t *testing.T) (*Allocation, *Leader) {
	cur := &Allocation{Policy: "exports", Epoch: 3, Phase: PhaseStable,
		Default: map[string]float64{"a": 0.35, "b": 0.35, "c": 0.3}, Safe: map[string]float64{"a": 0.05, "b": 0.05, "c": 0.3}}
	p := params()
	p.MaxStep = 1
	return cur, leader(t, p, t0.Add(-time.Hour))
}

// TestLoweredMinimumOfACutOffRegionStaysReserved: an operator lowers the
// minimum of a region cut off from etcd. Its nodes fall back to the safe
// share they last read, so the plan keeps reserving that share until the
// region acknowledges an epoch that carries the lower one, however many
// epochs are published meanwhile.
func TestLoweredMinimumOfACutOffRegionStaysReserved(t *testing.T) {
	cur, l := safeCAt03(t)
	allocs := func() map[string]*Allocation { return map[string]*Allocation{"exports": cur} }
	v := nodes(map[string]uint64{"a": 3, "b": 3}, "a", "b")
	offered(v, "a", 30)
	offered(v, "b", 30)
	l.Track(t0.Add(-time.Minute), v, allocs()) // c has been gone a minute
	for i, minimum := range []float64{0.2, 0.05} {
		now := t0.Add(time.Duration(i) * time.Second)
		l.Track(now, v, allocs())
		l.Observe(v, []Policy{exports})
		d := l.Plan(now, v, exports, cur, Control{Minimums: map[string]float64{"c": minimum}}, true)
		if d.Publish == nil {
			t.Fatalf("minimum %v: nothing published (%q)", minimum, d.Note)
		}
		if got := d.Publish.Default["c"]; got < 0.3-1e-12 {
			t.Fatalf("minimum %v: cut-off c, which may enforce 0.3, left %v: a and b may admit %v", minimum, got, 1-got)
		}
		if d.Publish.Safe["c"] != minimum || d.Publish.Held["c"] != 0.3 {
			t.Fatalf("minimum %v: safe %v held %v, want %v and 0.3", minimum, d.Publish.Safe["c"], d.Publish.Held["c"], minimum)
		}
		cur = d.Publish
		v = nodes(map[string]uint64{"a": cur.Epoch, "b": cur.Epoch}, "a", "b")
		offered(v, "a", 30)
		offered(v, "b", 30)
	}
	// c comes back and acknowledges the epoch in force: the lower minimum
	// now counts.
	v = nodes(map[string]uint64{"a": cur.Epoch, "b": cur.Epoch, "c": cur.Epoch}, "a", "b", "c")
	offered(v, "a", 30)
	offered(v, "b", 30)
	now := t0.Add(time.Minute)
	l.Track(now, v, allocs())
	l.Observe(v, []Policy{exports})
	d := l.Plan(now, v, exports, cur, Control{Minimums: map[string]float64{"c": 0.05}}, true)
	if d.Publish == nil || d.Publish.Target == nil || d.Publish.Target.Default["c"] > 0.05+1e-9 {
		t.Fatalf("after c acknowledged: %+v", d.Publish)
	}
}

// TestLoweredMinimumOfACutOffNodeStaysReserved: region c runs nodes c1
// and c2; an operator lowers c's minimum while c1 is cut off. c1's lease
// ends before it applied the lower safe share, so it falls back to the
// one it last read (0.3) and, alive, enforces it until it comes back.
// c2 acknowledging the lower one must not release c1's share, however
// long c1 stays away; once c1 registers again and acknowledges, it does.
func TestLoweredMinimumOfACutOffNodeStaysReserved(t *testing.T) {
	cur, l := safeCAt03(t)
	allocs := func() map[string]*Allocation { return map[string]*Allocation{"exports": cur} }
	// view has a, b and c2 at epoch e, and c1 (at c1, when ≥ 0) or not.
	view := func(e uint64, c1 int) *View {
		v := nodes(map[string]uint64{"a": e, "b": e}, "a", "b")
		v.Regions["c"] = map[string]Node{"c2": {Acked: map[string]uint64{"exports": e}}}
		if c1 >= 0 {
			v.Regions["c"]["c1"] = Node{Acked: map[string]uint64{"exports": uint64(c1)}}
		}
		offered(v, "a", 30)
		offered(v, "b", 30)
		return v
	}
	ctl := Control{Minimums: map[string]float64{"c": 0.05}}
	now := t0
	round := func(v *View) {
		t.Helper()
		l.Track(now, v, allocs())
		l.Observe(v, []Policy{exports})
		if d := l.Plan(now, v, exports, cur, ctl, true); d.Publish != nil {
			cur = d.Publish
		}
		now = now.Add(3 * time.Second) // past the skew margin
	}
	round(view(3, 3))
	if cur.Epoch != 4 || cur.Safe["c"] != 0.05 || cur.Held["c"] != 0.3 {
		t.Fatalf("lowering c's minimum: epoch %d safe %v held %v, want 4, c at 0.05 holding 0.3", cur.Epoch, cur.Safe, cur.Held)
	}
	for range 10 {
		round(view(cur.Epoch, -1)) // c1 gone, the others acknowledge
		if got := cur.Default["c"]; got < 0.3-1e-9 {
			t.Fatalf("epoch %d: c1, cut off at safe share 0.3, may still enforce it; c has %v, a and b %v",
				cur.Epoch, got, cur.Default["a"]+cur.Default["b"])
		}
	}
	away := view(cur.Epoch, -1)
	if l.acknowledged(now, away, "exports", "c", cur.Epoch) || l.Clone().acknowledged(now, away, "exports", "c", cur.Epoch) {
		t.Fatal("c counts as acknowledged while c1 is away (or a clone forgot c1)")
	}
	round(view(cur.Epoch, 0)) // c1 registers again
	round(view(cur.Epoch, int(cur.Epoch)))
	round(view(cur.Epoch, int(cur.Epoch)))
	if cur.Target != nil {
		round(view(cur.Epoch, int(cur.Epoch)))
	}
	if got := cur.Default["c"]; got > 0.05+1e-9 {
		t.Fatalf("after c1 came back and acknowledged epoch %d: c still holds %v", cur.Epoch, got)
	}
}

// TestRaisedMinimumWaitsForTheGrowth: raising a region's minimum moves
// share to it; the shrink epoch keeps the old safe share (a region that
// falls back before the others shrank would otherwise take the new one
// on top of their old shares) and the growth publishes the new one.
func TestRaisedMinimumWaitsForTheGrowth(t *testing.T) {
	cur := &Allocation{Policy: "exports", Epoch: 1, Phase: PhaseStable,
		Default: map[string]float64{"a": 0.5, "b": 0.3, "c": 0.2}, Safe: map[string]float64{"a": 0.05, "b": 0.05, "c": 0.05}}
	v := nodes(map[string]uint64{"a": 1, "b": 1, "c": 1}, "a", "b", "c")
	offered(v, "a", 50)
	offered(v, "b", 30)
	offered(v, "c", 20)
	l := leader(t, params(), t0.Add(-time.Hour))
	l.Observe(v, []Policy{exports})
	ctl := Control{Minimums: map[string]float64{"c": 0.4}}
	d := l.Plan(t0, v, exports, cur, ctl, true)
	shrink := d.Publish
	if shrink == nil || shrink.Phase != PhaseShrink {
		t.Fatalf("raising c's minimum: %+v (%q), want a shrink epoch", shrink, d.Note)
	}
	if shrink.Safe["c"] != 0.05 || shrink.TargetSafe["c"] != 0.4 {
		t.Fatalf("shrink epoch safe %v target safe %v, want c at 0.05 then 0.4", shrink.Safe, shrink.TargetSafe)
	}
	v = nodes(map[string]uint64{"a": 2, "b": 2, "c": 2}, "a", "b", "c")
	d = l.Plan(t0.Add(time.Second), v, exports, shrink, ctl, false)
	if d.Publish == nil || d.Publish.Phase != PhaseStable || d.Publish.Safe["c"] != 0.4 || d.Publish.Default["c"] < 0.4 {
		t.Fatalf("growth: %+v", d.Publish)
	}
}

func TestSumDemand(t *testing.T) {
	reports := []map[string]PolicyDemand{
		{"p": {Offered: 3, Admitted: 2, Pressured: []SubjectDemand{{Subject: "x", Offered: 2, Admitted: 1, Denied: true}, {Subject: "y", Offered: 1}}}},
		{"p": {Offered: 5, Admitted: 5, Pressured: []SubjectDemand{{Subject: "y", Offered: 4, Admitted: 4}, {Subject: "z", Offered: math.NaN()}}},
			"q": {Offered: 1, Admitted: 1}},
	}
	got := SumDemand(reports, 2)
	p := got["p"]
	if p.Offered != 8 || p.Admitted != 7 {
		t.Fatalf("p summed to %+v", p)
	}
	want := []SubjectDemand{{Subject: "y", Offered: 5, Admitted: 4}, {Subject: "x", Offered: 2, Admitted: 1, Denied: true}}
	if len(p.Pressured) != len(want) {
		t.Fatalf("pressured %+v, want %+v", p.Pressured, want)
	}
	for i := range want {
		if p.Pressured[i] != want[i] {
			t.Errorf("pressured[%d] = %+v, want %+v", i, p.Pressured[i], want[i])
		}
	}
	if q := got["q"]; q.Offered != 1 {
		t.Errorf("q = %+v", q)
	}
}

// TestAckDeadline: a node whose keepalives work but whose watch of the
// allocations is stalled never acknowledges; past the deadline (from when
// this leader first saw the shrink, plus the skew margin) it has fallen
// back by itself, and the growth stops waiting for it. Without a deadline
// the growth waits for it forever.
func TestAckDeadline(t *testing.T) {
	cur := &Allocation{Policy: "exports", Epoch: 5, Phase: PhaseShrink,
		Default: map[string]float64{"a": 0.4, "b": 0.4}, Target: &Shares{Default: map[string]float64{"a": 0.6, "b": 0.4}},
		Safe: map[string]float64{"a": 0.05, "b": 0.05}}
	v := &View{Regions: map[string]map[string]Node{
		"a": {"1": {Acked: map[string]uint64{"exports": 5}}, "2": {Acked: map[string]uint64{"exports": 4}}},
		"b": {"1": {Acked: map[string]uint64{"exports": 5}}},
	}}
	allocs := map[string]*Allocation{"exports": cur}
	p := params()
	p.AckDeadline = 10 * time.Second
	for _, c := range []struct {
		deadline time.Duration
		after    time.Duration
		grows    bool
		until    time.Time
	}{
		{10 * time.Second, 5 * time.Second, false, t0.Add(12 * time.Second)},
		{10 * time.Second, 12 * time.Second, true, time.Time{}},
		{0, time.Hour, false, time.Time{}},
	} {
		p.AckDeadline = c.deadline
		l := leader(t, p, t0.Add(-time.Hour))
		l.Track(t0, v, allocs) // first sees the shrink
		now := t0.Add(c.after)
		l.Track(now, v, allocs)
		d := l.Plan(now, v, exports, cur, Control{}, false)
		if grew := d.Publish != nil; grew != c.grows {
			t.Fatalf("deadline %v, %v after the shrink: grew %v (%q), want %v", c.deadline, c.after, grew, d.Note, c.grows)
		}
		if c.grows && (len(d.Missed) != 1 || d.Missed[0] != "a/2") {
			t.Errorf("missed %v, want [a/2]", d.Missed)
		}
		if !c.grows && !d.WaitUntil.Equal(c.until) {
			t.Errorf("deadline %v: waits until %v, want %v", c.deadline, d.WaitUntil, c.until)
		}
	}
}

// TestRetiredRegionLeavesTheAllocation: a mistyped region that once got a
// minimum stays in every allocation and can push the minimums above 1,
// so nothing can be published; retired (and without a node), it leaves
// the allocation. A retired region that registers again takes part.
func TestRetiredRegionLeavesTheAllocation(t *testing.T) {
	cur := &Allocation{Policy: "exports", Epoch: 3, Phase: PhaseStable,
		Default: map[string]float64{"a": 0.3, "b": 0.3, "eu-wets": 0.4}, Safe: map[string]float64{"a": 0.05, "b": 0.05, "eu-wets": 0.4}}
	ctl := Control{Minimums: map[string]float64{"a": 0.3, "b": 0.3, "eu-wets": 0.5}}
	v := nodes(map[string]uint64{"a": 3, "b": 3}, "a", "b")
	offered(v, "a", 10)
	offered(v, "b", 10)
	l := leader(t, params(), t0.Add(-time.Hour))
	l.Observe(v, []Policy{exports})
	if d := l.Plan(t0, v, exports, cur, ctl, true); d.Publish != nil || !strings.Contains(d.Note, "minimum") {
		t.Fatalf("minimums summing to 1.1: %+v (%q), want no publish and a note", d.Publish, d.Note)
	}
	v.Retired = map[string]bool{"eu-wets": true}
	d := l.Plan(t0, v, exports, cur, ctl, true)
	if d.Publish == nil {
		t.Fatalf("after retiring eu-wets: nothing published (%q)", d.Note)
	}
	target := d.Publish.Default
	if d.Publish.Target != nil {
		target = d.Publish.Target.Default
	}
	if _, ok := target["eu-wets"]; ok || math.Abs(sum(target)-1) > 1e-9 {
		t.Fatalf("after retiring eu-wets: %v, want a and b holding the whole budget", target)
	}
	// eu-wets registers again: it takes part, with its minimum.
	v.Regions["eu-wets"] = map[string]Node{"n": {}}
	if d := l.Plan(t0, v, exports, cur, Control{}, true); d.Proposal == nil || d.Proposal.Default["eu-wets"] == 0 {
		t.Fatalf("a retired region back with a node: proposal %+v (%q)", d.Proposal, d.Note)
	}
}

// TestMismatchedRegionNotCounted: a region one of whose nodes decides
// with other policies or subject naming than most nodes (another
// fingerprint) would count a tenant under other subjects or limits; the
// split does not count it as live, so it keeps its minimum.
func TestMismatchedRegionNotCounted(t *testing.T) {
	fp := func(f string) Node { return Node{Fingerprint: f} }
	v := &View{Regions: map[string]map[string]Node{
		"a": {"1": fp("x"), "2": fp("x")},
		"b": {"1": fp("x")},
		"c": {"1": fp("x"), "2": fp("y")},
	}, Demand: map[string]map[string]PolicyDemand{}}
	for _, r := range []string{"a", "b", "c"} {
		offered(v, r, 10)
	}
	if got := v.Mismatched(); len(got) != 1 || got[0] != "c" {
		t.Fatalf("Mismatched() = %v, want [c]", got)
	}
	l := leader(t, params(), t0)
	l.Observe(v, []Policy{exports})
	d := l.Plan(t0, v, exports, nil, Control{}, true)
	if d.Publish == nil || d.Publish.Default["c"] != exports.DefaultMinShare || len(d.Mismatched) != 1 {
		t.Fatalf("c with a node of another fingerprint: %+v, mismatched %v; want c at its minimum", d.Publish, d.Mismatched)
	}
	// Every node agrees (or reports nothing): everyone counts.
	v.Regions["c"]["2"] = fp("")
	if got := v.Mismatched(); got != nil {
		t.Fatalf("Mismatched() = %v once c agrees", got)
	}
}

// TestNewLeaderReadsBackVanishedNodes: a new leader reads the vanished
// nodes a former leader kept (View.Behind): the region has not
// acknowledged an epoch such a node is behind, until it registers again;
// what it reads stays within MaxBehind nodes.
func TestNewLeaderReadsBackVanishedNodes(t *testing.T) {
	l := leader(t, params(), t0.Add(-time.Hour))
	v := nodes(map[string]uint64{"a": 5, "c": 5}, "a", "c")
	v.Behind = map[string]Behind{"c": {"c1": {"exports": 4}}}
	l.Track(t0, v, nil)
	if l.acknowledged(t0, v, "exports", "c", 5) {
		t.Fatal("c counts as acknowledging epoch 5 while c1, read back at epoch 4, is away")
	}
	if got := l.Behind()["c"]["c1"]["exports"]; got != 4 {
		t.Fatalf("Behind() = %v, want c1 at 4 kept for the next leader", l.Behind())
	}
	v.Regions["c"]["c1"] = Node{Acked: map[string]uint64{"exports": 5}}
	l.Track(t0, v, nil)
	if !l.acknowledged(t0, v, "exports", "c", 5) || len(l.Behind()) != 0 {
		t.Fatalf("c1 back at epoch 5: acknowledged %v, behind %v", l.acknowledged(t0, v, "exports", "c", 5), l.Behind())
	}
	many := Behind{}
	for i := range MaxBehind + 10 {
		many[fmt.Sprintf("n%d", i)] = map[string]uint64{"exports": uint64(3 + i%2)}
	}
	v.Behind = map[string]Behind{"b": many}
	l.Track(t0, v, nil)
	if l.nbehind > MaxBehind || len(l.Behind()["b"]) > MaxBehind {
		t.Fatalf("%d vanished nodes read back, over the bound %d", l.nbehind, MaxBehind)
	}
	if got := l.Behind()["b"][""]["exports"]; got != 3 {
		t.Fatalf("folded vanished nodes of b at %d, want the lowest epoch 3", got)
	}
}
