package plan

import (
	"encoding/json"
	"maps"
	"math"
	"strconv"
	"testing"
	"time"
)

// report is what regions a and b offer of policy exports in one round,
// and what they offer for its pressured subject s (0: not pressured).
type report struct{ a, b, sa, sb float64 }

// reportView is a view of regions a and b, one node each acknowledging
// epoch, reporting r.
func reportView(epoch uint64, r report) *View {
	v := nodes(map[string]uint64{"a": epoch, "b": epoch}, "a", "b")
	for _, x := range []struct {
		region      string
		total, subj float64
	}{{"a", r.a, r.sa}, {"b", r.b, r.sb}} {
		var pressured []SubjectDemand
		if x.subj > 0 {
			pressured = []SubjectDemand{{Subject: "s", Offered: x.subj}}
		}
		offered(v, x.region, x.total, pressured...)
	}
	return v
}

// settleOn runs one full round of l on r over cur at now and, when it
// publishes a shrink, the acknowledgements and the round that grows:
// it returns the allocation then in force.
func settleOn(t *testing.T, l *Leader, now time.Time, r report, cur *Allocation) *Allocation {
	t.Helper()
	pol := Policy{Name: "exports", Rate: 10}
	var epoch uint64
	if cur != nil {
		epoch = cur.Epoch
	}
	v := reportView(epoch, r)
	l.Track(now, v, map[string]*Allocation{"exports": cur})
	l.Observe(v, []Policy{pol})
	d := l.Plan(now, v, pol, cur, Control{}, true)
	if d.Publish == nil {
		return cur
	}
	cur = d.Publish
	if cur.Phase == PhaseShrink {
		v = reportView(cur.Epoch, r)
		l.Track(now, v, map[string]*Allocation{"exports": cur})
		if d = l.Plan(now, v, pol, cur, Control{}, false); d.Publish == nil {
			t.Fatalf("growth after the acknowledged shrink %d: %s", cur.Epoch, d.Note)
		}
		cur = d.Publish
	}
	return cur
}

// stored is a as a new leader reads it from etcd.
func stored(t *testing.T, a *Allocation) *Allocation {
	t.Helper()
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var out Allocation
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// TestNewLeaderPlansFromThePublishedDemand: a leader settles a policy on
// steady reports; then its next round and a new leader's first round read
// the same latest report. The new leader, starting from the demand the
// allocation in force records, smooths that report as the old leader
// does: it plans the same demand and publishes only when the old leader
// would. Starting from the report as it is (a record without the demand,
// which is what every leader did before), a report's noise moves the
// shares past the dead band.
func TestNewLeaderPlansFromThePublishedDemand(t *testing.T) {
	steady := []report{{a: 50, b: 50}, {a: 50, b: 50}, {a: 50, b: 50}, {a: 50, b: 50}}
	steadySubject := []report{{80, 20, 3, 3}, {80, 20, 3, 3}, {80, 20, 3, 3}, {80, 20, 3, 3}}
	cases := []struct {
		name    string
		history []report
		last    report
		// moves: the old leader's next round (and so the new leader's
		// first) publishes; movesAsItWas: a new leader without the
		// recorded demand does.
		moves, movesAsItWas bool
	}{
		{"steady, the last report 1.5% off", steady, report{a: 51.5, b: 48.5}, false, true},
		{"steady subject, its last report 10% off in b", steadySubject, report{80, 20, 3, 3.3}, false, true},
		{"steady, the same report", steady, report{a: 50, b: 50}, false, false},
		{"demand moved to a", steady, report{a: 80, b: 20}, true, true},
		{"the subject moved to b", steadySubject, report{80, 20, 3, 9}, true, true},
	}
	pol := Policy{Name: "exports", Rate: 10}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old := leader(t, params(), t0)
			now := t0
			var cur *Allocation
			for _, r := range c.history {
				now = now.Add(10 * time.Second)
				cur = settleOn(t, old, now, r, cur)
			}
			if cur == nil || cur.Phase != PhaseStable {
				t.Fatalf("no stable allocation after the history: %+v", cur)
			}
			rec := stored(t, cur)
			if rec.Demand == nil || c.history[0].sa > 0 && rec.SubjectDemand["s"] == nil {
				t.Fatalf("the allocation records no demand: %+v", rec)
			}
			now = now.Add(10 * time.Second)
			next := func(l *Leader, a *Allocation) Decision {
				v := reportView(a.Epoch, c.last)
				l.Track(now, v, map[string]*Allocation{"exports": a})
				l.Observe(v, []Policy{pol})
				return l.Plan(now, v, pol, a, Control{}, true)
			}
			want := next(old, rec)
			if got := want.Publish != nil; got != c.moves {
				t.Fatalf("the old leader's next round publishes: %v, want %v (%+v)", got, c.moves, want.Publish)
			}
			got := next(leader(t, params(), now.Add(-time.Second)), rec)
			if (got.Publish != nil) != c.moves {
				t.Errorf("the new leader's first round publishes: %v, want %v (%+v)", got.Publish != nil, c.moves, got.Publish)
			}
			if !near(got.Demand, want.Demand) || !near(got.Proposal.Default, want.Proposal.Default) ||
				!near(got.Proposal.Overrides["s"], want.Proposal.Overrides["s"]) {
				t.Errorf("the new leader plans %v %+v, the old one %v %+v", got.Demand, got.Proposal, want.Demand, want.Proposal)
			}
			bare := *rec
			bare.Demand, bare.SubjectDemand = nil, nil
			if asWas := next(leader(t, params(), now.Add(-time.Second)), &bare); (asWas.Publish != nil) != c.movesAsItWas {
				t.Errorf("from the report as it is, the first round publishes: %v, want %v (%+v)", asWas.Publish != nil, c.movesAsItWas, asWas.Publish)
			}
		})
	}
}

// near says a and b hold the same regions with values within 1e-12.
func near(a, b map[string]float64) bool {
	return maps.EqualFunc(a, b, func(x, y float64) bool { return math.Abs(x-y) <= 1e-12 })
}

// TestRecallDemand: what a leader takes of the demand an allocation
// records, before its first observation of the policy.
func TestRecallDemand(t *testing.T) {
	p := params()
	p.MaxOverrides = 2
	many := map[string]map[string]float64{}
	for i := range 6 {
		many["s"+strconv.Itoa(i)] = map[string]float64{"a": 0.1}
	}
	cases := []struct {
		name string
		// observed: the leader observed the policy before reading a.
		observed bool
		a        Allocation
		// wantRegions and wantSubjects: the smoothed demand after
		// Track (nil: none).
		wantRegions  map[string]float64
		wantSubjects []string
	}{
		{"a record without demand", false, Allocation{}, nil, nil},
		{"the regions and a subject", false,
			Allocation{Demand: map[string]float64{"a": 0.7, "b": 0.3}, SubjectDemand: map[string]map[string]float64{"s": {"a": 0.4}}},
			map[string]float64{"a": 0.7, "b": 0.3}, []string{"s"}},
		{"a negative demand", false, Allocation{Demand: map[string]float64{"a": -1, "b": 2}}, nil, nil},
		{"a subject with a negative demand", false,
			Allocation{Demand: map[string]float64{"a": 1}, SubjectDemand: map[string]map[string]float64{"s": {"a": -0.1}, "t": {"a": 0.1}}},
			map[string]float64{"a": 1}, []string{"t"}},
		{"at most 2·MaxOverrides subjects, in name order", false,
			Allocation{Demand: map[string]float64{"a": 1}, SubjectDemand: many},
			map[string]float64{"a": 1}, []string{"s0", "s1", "s2", "s3"}},
		{"a leader that observed the policy keeps its own", true,
			Allocation{Demand: map[string]float64{"a": 0.1, "b": 0.9}}, map[string]float64{"a": 0.5, "b": 0.5}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := leader(t, p, t0)
			v := reportView(0, report{a: 10, b: 10})
			if c.observed {
				l.Observe(v, []Policy{{Name: "exports", Rate: 10}})
			}
			c.a.Policy, c.a.Epoch = "exports", 1
			l.Track(t0, v, map[string]*Allocation{"exports": &c.a})
			regions, subjects := l.Demand("exports")
			if !maps.Equal(regions, c.wantRegions) {
				t.Errorf("regions %v, want %v", regions, c.wantRegions)
			}
			if len(subjects) != len(c.wantSubjects) {
				t.Errorf("subjects %v, want %v", subjects, c.wantSubjects)
			}
			for _, s := range c.wantSubjects {
				if subjects[s] == nil {
					t.Errorf("subject %s not recalled: %v", s, subjects)
				}
			}
		})
	}
}

// TestRecalledRegionGoneIsDropped: a region the recorded demand names
// that has no registered node now loses its demand at the first
// observation, and the policy is not settled.
func TestRecalledRegionGoneIsDropped(t *testing.T) {
	l := leader(t, params(), t0)
	a := &Allocation{Policy: "exports", Epoch: 1, Demand: map[string]float64{"a": 0.4, "b": 0.4, "c": 0.2}}
	v := reportView(1, report{a: 10, b: 10})
	l.Track(t0, v, map[string]*Allocation{"exports": a})
	l.Observe(v, []Policy{{Name: "exports", Rate: 10}})
	d, _ := l.Demand("exports")
	if _, ok := d["c"]; ok || !near(d, map[string]float64{"a": 0.45, "b": 0.45}) {
		t.Fatalf("demand %v, want a and b smoothed from 0.4 toward 0.5, c dropped", d)
	}
	if l.Settled("exports") {
		t.Error("settled after a region's demand was dropped")
	}
}
