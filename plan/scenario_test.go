package plan_test

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/sim"
)

// TestScenariosKeepTheBound runs the planner through every built-in
// scenario of the simulator (shortened): under the two-step protocol the
// shares the regions enforce never sum above 1 and no window admits more
// than a global bucket could; the naive protocol is run for contrast.
func TestScenariosKeepTheBound(t *testing.T) {
	for _, name := range sim.Builtin() {
		sc, err := sim.LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, protocol := range []sim.Protocol{sim.TwoStep, sim.Naive} {
			res, err := sim.Run(sim.Config{Scenario: sc, Subjects: 300, Duration: 10 * time.Minute, Seed: 7,
				RebalanceInterval: 2 * time.Second, Protocol: protocol, NoBaselines: true})
			if err != nil {
				t.Fatalf("%s %s: %v", name, protocol, err)
			}
			if res.Epochs < 2 {
				t.Errorf("%s %s: %d epochs: the planner never moved a share", name, protocol, res.Epochs)
			}
			if protocol == sim.TwoStep && (res.MaxShareSum > 1+1e-9 || res.Overshoot1s > 0 || res.Overshoot10s > 0 || res.Overshoot60s > 0 || res.OvershootWindow > 0) {
				t.Errorf("%s two-step: Σ shares %v, overshoot %v/%v/%v, per window %v", name, res.MaxShareSum, res.Overshoot1s, res.Overshoot10s, res.Overshoot60s, res.OvershootWindow)
			}
		}
	}
}
