package sim

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// TestWindowPoliciesKeepTheBound plays window-shift (hot tenants hopping
// regions every 90 s, so shares move in the middle of 60 s windows) with
// each window algorithm. Under the two-step protocol with the node's rule
// (a window's count is charged at the lowest share since the window
// began) no aligned window admits more than C; without the rule the
// regions together admit far more in one window, as nodes did before it.
func TestWindowPoliciesKeepTheBound(t *testing.T) {
	base, err := LoadScenario("window-shift")
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []bucket.Algorithm{bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog} {
		sc := *base
		sc.Algorithm = alg
		worstWithout := 0.0
		for _, iv := range []time.Duration{time.Second, 15 * time.Second} {
			cfg := Config{Scenario: &sc, Seed: 1, Subjects: 300, Duration: 20 * time.Minute, RebalanceInterval: iv}
			res, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.OvershootWindow != 0 || res.MaxShareSum > 1+1e-9 {
				t.Errorf("%s at %v, two-step: overshoot per window %v, Σ shares %v; want 0 and ≤ 1", alg, iv, res.OvershootWindow, res.MaxShareSum)
			}
			if res.Epochs < 10 {
				t.Errorf("%s at %v: %d epochs: shares hardly moved", alg, iv, res.Epochs)
			}
			cfg.NoShareRules = true
			without, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			worstWithout = max(worstWithout, without.OvershootWindow)
		}
		if worstWithout < 0.1 {
			t.Errorf("%s without the rule: overshoot per window at most %v; the scenario no longer moves shares mid-window", alg, worstWithout)
		}
	}
}

func TestMostAdmitted(t *testing.T) {
	cases := []struct {
		alg     bucket.Algorithm
		window  time.Duration
		seconds float64
		want    float64
	}{
		{"", 0, 10, 20 + 2*10},
		{bucket.FixedWindow, time.Minute, 1, 40},
		{bucket.FixedWindow, time.Minute, 60, 40},
		{bucket.SlidingWindow, time.Minute, 61, 60},
		{bucket.SlidingLog, time.Minute, 60, 20},
		{bucket.SlidingLog, time.Minute, 1, 20},
	}
	for _, c := range cases {
		s := Scenario{Capacity: 20, RefillPerSecond: 2, Algorithm: c.alg, Window: Duration(c.window)}
		if got := s.mostAdmitted(c.seconds); got != c.want {
			t.Errorf("%s %v over %vs: %v, want %v", c.alg, c.window, c.seconds, got, c.want)
		}
	}
}

// TestPredictOvershootWindow: a dry run of a fixed-window policy is
// simulated as one (its figure is the per-window overshoot); moving most
// of the share at once under the naive protocol can overshoot a window,
// the two-step protocol cannot.
func TestPredictOvershootWindow(t *testing.T) {
	base := Proposal{Current: []float64{.8, .1, .1}, Proposed: []float64{.1, .8, .1}, Demand: []float64{2, 2, 0},
		Capacity: 60, RefillPerSecond: 1, Algorithm: bucket.FixedWindow, Window: time.Minute,
		RebalanceInterval: time.Second, PropagationDelay: 2 * time.Second, Duration: 10 * time.Minute, Seed: 1}
	two, err := PredictOvershoot(base)
	if err != nil {
		t.Fatal(err)
	}
	if two.OvershootWindow > 0 || two.MaxShareSum > 1+1e-9 {
		t.Errorf("two-step prediction of a window policy overshoots: %+v", two)
	}
	bad := base
	bad.Window = 0
	if _, err := PredictOvershoot(bad); err == nil {
		t.Error("a window policy without a window was accepted")
	}
}
