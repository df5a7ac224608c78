package sim

import (
	"fmt"
	"testing"
	"time"
)

// TestTenantMoveKeepsTheBound plays tenant-move: aggregate demand moves
// from region 0 to region 1, and a tenant that spent its budget in region
// 0 sends to region 1 within one refill time, where it has no bucket yet.
// With the node's rule (a bucket the region creates starts at the lowest
// share the region held over the last refill time) the two protocols
// admit no more than one global bucket would; without it, as nodes did
// before the rule, the tenant finds region 1's grown share full and the
// regions together overshoot.
func TestTenantMoveKeepsTheBound(t *testing.T) {
	sc, err := LoadScenario("tenant-move")
	if err != nil {
		t.Fatal(err)
	}
	for _, iv := range []time.Duration{time.Second, 5 * time.Second} {
		cfg := Config{Scenario: sc, Seed: 1, Subjects: 500, RebalanceInterval: iv}
		res, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if w := res.worst(); w != 0 || res.MaxShareSum > 1+1e-9 {
			t.Errorf("at %v, two-step: overshoot %v, Σ shares %v; want 0 and ≤ 1", iv, w, res.MaxShareSum)
		}
		if res.Epochs < 3 {
			t.Errorf("at %v: %d epochs: shares hardly moved", iv, res.Epochs)
		}
		cfg.NoShareRules = true
		without, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if w := without.worst(); w < 0.01 {
			t.Errorf("at %v without the rule: overshoot %v; the tenant no longer finds a grown share", iv, w)
		}
	}
}

func TestScenarioStepsAndFirst(t *testing.T) {
	base := `{"name": "x", "regions": 2, "subjects": 10, "duration": "1m", "tick": "100ms", "capacity": 10, "refill_per_second": 1, "groups": [%s]}`
	for _, c := range []struct {
		group string
		ok    bool
	}{
		{`{"name": "g", "first": 3, "count": 2, "rate": 1, "profile": {"kind": "steps", "steps": [{"at": "10s", "weights": [0, 1]}, {"at": "20s", "weights": [0, 0]}]}}`, true},
		{`{"name": "g", "first": 10, "rate": 1}`, false},
		{`{"name": "g", "first": -1, "rate": 1}`, false},
		{`{"name": "g", "rate": 1, "profile": {"kind": "steps"}}`, false},
		{`{"name": "g", "rate": 1, "profile": {"kind": "steps", "steps": [{"at": "20s", "weights": [1]}, {"at": "10s", "weights": [1]}]}}`, false},
		{`{"name": "g", "rate": 1, "profile": {"kind": "steps", "steps": [{"at": "-1s", "weights": [1]}]}}`, false},
	} {
		_, err := ParseScenario([]byte(fmt.Sprintf(base, c.group)))
		if (err == nil) != c.ok {
			t.Errorf("group %s: err %v, want ok %v", c.group, err, c.ok)
		}
	}
	// The steps group sends only to region 1 from 10 s to 20 s, only as
	// subjects 3 and 4.
	sc, err := ParseScenario([]byte(fmt.Sprintf(base, `{"name": "g", "first": 3, "count": 2, "rate": 5, "profile": {"kind": "steps", "weights": [0, 0], "steps": [{"at": "10s", "weights": [0, 1]}, {"at": "20s", "weights": [0, 0]}]}}`)))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = Arrivals(Config{Scenario: sc, Seed: 1}, func(a Arrival) bool {
		n++
		if a.At < 10*time.Second || a.At >= 20*time.Second || a.Region != 1 || a.Subject < 3 || a.Subject > 4 {
			t.Errorf("arrival %+v outside the steps group's region, time or subjects", a)
		}
		return true
	})
	if err != nil || n == 0 {
		t.Fatalf("%d arrivals, %v", n, err)
	}
}

// TestLowShareIsLowestShare holds the cached lookup of the fill and
// window rules to the history it stands for: at every admission of a run
// whose shares move every second, lowShare of every subject in that
// region equals lowestShare over the rule's span, for subjects with and
// without overrides, and falls below the current share for some of them.
func TestLowShareIsLowestShare(t *testing.T) {
	for _, name := range []string{"hot-tenant", "window-shift"} {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := Config{Scenario: sc, Seed: 1, Subjects: 100, Duration: 2 * time.Minute, RebalanceInterval: time.Second}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		var e *engine
		var held, below, calls int
		cfg.Admitted = func(a RegionAdmission) {
			r := a.Region
			from := e.now - e.refill
			if e.windowed {
				within, _ := e.prep.Limits().CountedFor(0)
				from = e.now - within
			}
			for j := int32(0); j < int32(e.sc.Subjects); j++ {
				got, want := e.lowShare(r, j, from), e.lowestShare(r, j, from)
				if got != want {
					t.Fatalf("%s at %v: region %d subject %d: lowShare %v, lowestShare %v", name, e.now, r, j, got, want)
				}
				calls++
				if e.lows[r].held[j] > 0 {
					held++
				}
				if want < e.applied[r].share(r, j) {
					below++
				}
			}
		}
		if e, err = newEngine(cfg, nil, true); err != nil {
			t.Fatal(err)
		}
		if err := e.run(); err != nil {
			t.Fatal(err)
		}
		if held == 0 || held == calls || below == 0 {
			t.Errorf("%s: %d lookups, %d of subjects with an override, %d below the current share: the run does not exercise both", name, calls, held, below)
		}
	}
}

// TestLimitsConvertedOncePerShare: a region converts the bucket limits
// at an override's share once while it holds it, not at every decision
// of a subject whose override differs from the last one decided.
func TestLimitsConvertedOncePerShare(t *testing.T) {
	sc, err := LoadScenario("steady")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{Scenario: sc, Seed: 1, Subjects: 10, NoBaselines: true}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(cfg, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	e.setApplied(0, &allocation{epoch: 1, def: []float64{0.3, 0.4, 0.3},
		overrides: map[int32][]float64{1: {0.2, 0.4, 0.4}, 2: {0.25, 0.35, 0.4}}})
	before := e.converted
	for tick := int64(0); tick < 20; tick++ {
		e.now = time.Duration(tick) * e.tick
		e.nowUs = e.now.Microseconds()
		for _, j := range []int32{1, 2, 3} {
			e.decide(0, tick, j, 1)
		}
	}
	if e.err != nil {
		t.Fatal(e.err)
	}
	if got := e.converted - before; got != 3 {
		t.Errorf("%d limits converted for the three shares region 0 holds", got)
	}
}
