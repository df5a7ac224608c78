package boundcheck

import (
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/sim"
)

// TestSimulatedBuiltins runs every built-in scenario (at most 100
// subjects; one longer than 12 minutes is cut to 12 with its failures
// and shifts brought forward in proportion) under both protocols through
// the checker of live runs. The two-step protocol admits nothing over the bound; under
// either protocol the checker finds a violation exactly when the
// simulator reports overshoot, so a run that overshoots in the simulator
// is one the checker (and a live replay of its stream) shows.
func TestSimulatedBuiltins(t *testing.T) {
	for _, name := range sim.Builtin() {
		sc, err := sim.LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		sc = shortened(sc, 12*time.Minute)
		for _, p := range []sim.Protocol{sim.TwoStep, sim.Naive} {
			cfg := sim.Config{Scenario: sc, Seed: 1, Subjects: min(sc.Subjects, 100), Protocol: p, RebalanceInterval: time.Second, NoBaselines: true}
			res, rep, err := Simulated(cfg, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", name, p, err)
			}
			over := max(res.Overshoot1s, res.Overshoot10s, res.Overshoot60s, res.OvershootWindow)
			t.Logf("%s %s: %d admitted batches, %d windows, %d violations, overshoot %v", name, p, rep.Decisions, rep.Windows, len(rep.Violations), over)
			switch {
			case rep.Decisions == 0 || rep.Windows == 0:
				t.Errorf("%s %s: nothing checked", name, p)
			case p == sim.TwoStep && (len(rep.Violations) > 0 || over > 0):
				t.Errorf("%s two-step: overshoot %v, %d violations, first %v", name, over, len(rep.Violations), rep.Violations)
			case over > 0 && len(rep.Violations) == 0:
				t.Errorf("%s %s: the simulator reports overshoot %v, the checker finds nothing", name, p, over)
			case over == 0 && len(rep.Violations) > 0:
				t.Errorf("%s %s: the checker finds %v, the simulator reports no overshoot", name, p, rep.Violations[0])
			}
		}
	}
}

// shortened returns sc cut to at most d, its events and shifts at the
// same fractions of the run.
func shortened(sc *sim.Scenario, d time.Duration) *sim.Scenario {
	full := time.Duration(sc.Duration)
	if full <= d {
		return sc
	}
	s := *sc
	at := func(v sim.Duration) sim.Duration {
		return sim.Duration(time.Duration(v) / time.Second * d / full * time.Second)
	}
	s.Duration = sim.Duration(d)
	s.Events = nil
	for _, ev := range sc.Events {
		ev.At = at(ev.At)
		s.Events = append(s.Events, ev)
	}
	s.Shifts = nil
	for _, sh := range sc.Shifts {
		s.Shifts = append(s.Shifts, at(sh))
	}
	return &s
}

// flip has hot tenants hop between two regions every 4 s: with a 1 s
// rebalance and slow propagation the naive protocol leaves the regions'
// shares summing above 1 much of the time.
const flip = `{"name": "flip", "regions": 2, "subjects": 50, "duration": "10m", "tick": "100ms", "capacity": 20, "refill_per_second": 2,
 "groups": [{"name": "hot", "count": 5, "rate": 3, "profile": {"kind": "hop", "every": "4s"}}]}`

// TestSimulatedNaiveOvershoot: where the naive protocol overshoots in the
// simulator, the checker finds the windows, with what each region
// admitted in them; the two-step protocol on the same stream has none.
func TestSimulatedNaiveOvershoot(t *testing.T) {
	sc, err := sim.ParseScenario([]byte(flip))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []sim.Protocol{sim.TwoStep, sim.Naive} {
		cfg := sim.Config{Scenario: sc, Seed: 1, Protocol: p, RebalanceInterval: time.Second, PropagationDelay: 2 * time.Second}
		res, rep, err := Simulated(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		over := max(res.Overshoot1s, res.Overshoot10s, res.Overshoot60s)
		if p == sim.TwoStep {
			if over > 0 || len(rep.Violations) > 0 {
				t.Errorf("two-step: overshoot %v, violations %v", over, rep.Violations)
			}
			continue
		}
		if over == 0 || len(rep.Violations) == 0 {
			t.Fatalf("naive: overshoot %v, %d violations; want both", over, len(rep.Violations))
		}
		v := rep.Violations[0]
		if s := v.String(); !strings.Contains(s, "flip/s") || len(v.ByRegion) != 2 || float64(v.Admitted) <= v.Bound {
			t.Errorf("naive: violation %s, want one of flip over its bound with what both regions admitted", s)
		}
	}
}

func TestSimulatedErrors(t *testing.T) {
	if _, _, err := Simulated(sim.Config{}, nil); err == nil {
		t.Error("a config without a scenario was accepted")
	}
	sc, err := sim.ParseScenario([]byte(flip))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Simulated(sim.Config{Scenario: sc, Regions: 99}, nil); err == nil {
		t.Error("a config with 99 regions was accepted")
	}
}
