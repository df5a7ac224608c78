package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/bucket"
)

// Proposal is a change of one policy's default shares that an operator's
// dry-run wants priced.
type Proposal struct {
	// Current and Proposed are the shares per region before and after.
	Current, Proposed []float64
	// Demand is each region's offered rate as a multiple of the policy's
	// refill r (1 = the whole global rate).
	Demand []float64
	// Capacity (C) and RefillPerSecond (r) are the policy's limits; for a
	// window algorithm (Algorithm, Window) r is C/Window.
	Capacity        int64
	RefillPerSecond float64
	Overcommit      float64
	Algorithm       bucket.Algorithm
	Window          time.Duration
	// RebalanceInterval is how often the proposal is (re)published.
	RebalanceInterval time.Duration
	// Protocol defaults to TwoStep; PropagationDelay to 300 ms.
	Protocol         Protocol
	PropagationDelay time.Duration
	// Duration of the simulated period; default 10 minutes, at most 1 hour.
	Duration time.Duration
	Seed     uint64
}

// Prediction is the simulated outcome of a Proposal.
type Prediction struct {
	Overshoot1s, Overshoot10s, Overshoot60s float64
	// OvershootWindow is the window algorithms' figure (Figures).
	OvershootWindow float64
	UnderAdmission  float64
	MaxShareSum     float64
}

// PredictOvershoot simulates the change from Current to Proposed under the
// given demand, with a handful of subjects that each offer Demand, and
// returns the overshoot and under-admission it would cause.
func PredictOvershoot(p Proposal) (Prediction, error) {
	n := len(p.Current)
	if n == 0 || n > MaxScenarioRegions || len(p.Proposed) != n || len(p.Demand) != n {
		return Prediction{}, errors.New("sim: predict: current, proposed and demand need one value per region (1 to 16)")
	}
	budget := 1 + p.Overcommit
	sumC, sumP, total := 0.0, 0.0, 0.0
	for i := 0; i < n; i++ {
		for _, v := range []float64{p.Current[i], p.Proposed[i], p.Demand[i]} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return Prediction{}, fmt.Errorf("sim: predict: region %d: value %v must be finite and ≥ 0", i, v)
			}
		}
		sumC, sumP, total = sumC+p.Current[i], sumP+p.Proposed[i], total+p.Demand[i]
	}
	if sumC > budget+allocator.Tolerance || sumP > budget+allocator.Tolerance {
		return Prediction{}, fmt.Errorf("sim: predict: shares sum to %v and %v, above 1+ε = %v", sumC, sumP, budget)
	}
	if p.Duration == 0 {
		p.Duration = 10 * time.Minute
	}
	if p.Duration < time.Second || p.Duration > time.Hour {
		return Prediction{}, fmt.Errorf("sim: predict: duration %v outside [1s, 1h]", p.Duration)
	}
	if p.RebalanceInterval == 0 {
		p.RebalanceInterval = 5 * time.Second
	}
	sc := &Scenario{Name: "proposal", Regions: n, Subjects: 8, Duration: Duration(p.Duration), Tick: Duration(100 * time.Millisecond),
		Capacity: p.Capacity, RefillPerSecond: p.RefillPerSecond, Algorithm: p.Algorithm, Window: Duration(p.Window),
		Groups: []Group{{Name: "demand", Fraction: 1, Rate: total, Profile: Profile{Kind: ProfileWeights, Weights: p.Demand}}}}
	if total == 0 {
		sc.Groups[0].Profile.Weights = nil
	}
	res, err := Run(Config{Scenario: sc, Seed: p.Seed, Protocol: p.Protocol, RebalanceInterval: p.RebalanceInterval,
		PropagationDelay: p.PropagationDelay, InitialShares: p.Current, proposed: p.Proposed,
		Allocator: &allocator.Params{Overcommit: p.Overcommit}})
	if err != nil {
		return Prediction{}, fmt.Errorf("sim: predict: %w", err)
	}
	return Prediction{Overshoot1s: res.Overshoot1s, Overshoot10s: res.Overshoot10s, Overshoot60s: res.Overshoot60s,
		OvershootWindow: res.OvershootWindow, UnderAdmission: res.UnderAdmission, MaxShareSum: res.MaxShareSum}, nil
}
