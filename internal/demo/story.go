package demo

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quotacoord/quota/sim"
)

// ErrStory is wrapped by every error about a bad story.
var ErrStory = errors.New("demo: invalid story")

// Phase is a stretch of the story with constant offered rates.
type Phase struct {
	// Name is shown in the live view ("steady", "campaign", "failover").
	Name string
	// For is the phase's length.
	For time.Duration
	// Rates are the offered requests per second, one per region.
	Rates []float64
}

// Story is what the load driver plays: phases one after another, every
// request a check of cost 1 for Subject against Policy.
type Story struct {
	Regions []string
	Phases  []Phase
	Policy  string
	Subject string
	// Capacity (C) and RefillPerSecond (r) are the policy's global limits,
	// which the summary measures the admitted stream against.
	Capacity        int64
	RefillPerSecond float64
}

// Limits on stories, so that a flag cannot make the driver unbounded.
const (
	MaxPhases = 64
	MaxRate   = 20000 // requests per second per region
	MaxLength = 24 * time.Hour
)

// Validate reports whether the driver can play s.
func (s *Story) Validate() error {
	switch {
	case len(s.Regions) == 0 || len(s.Regions) > sim.MaxScenarioRegions:
		return fmt.Errorf("%w: %d regions, want 1 to %d", ErrStory, len(s.Regions), sim.MaxScenarioRegions)
	case len(s.Phases) == 0 || len(s.Phases) > MaxPhases:
		return fmt.Errorf("%w: %d phases, want 1 to %d", ErrStory, len(s.Phases), MaxPhases)
	case s.Policy == "" || s.Subject == "":
		return fmt.Errorf("%w: policy and subject are required", ErrStory)
	case s.Capacity < 1 || !(s.RefillPerSecond > 0) || math.IsInf(s.RefillPerSecond, 0):
		return fmt.Errorf("%w: capacity %d and refill %v must be positive", ErrStory, s.Capacity, s.RefillPerSecond)
	case s.Length() > MaxLength:
		return fmt.Errorf("%w: %v long, at most %v", ErrStory, s.Length(), MaxLength)
	}
	for i, p := range s.Phases {
		if p.For <= 0 {
			return fmt.Errorf("%w: phase %d (%s): length %v", ErrStory, i, p.Name, p.For)
		}
		if len(p.Rates) != len(s.Regions) {
			return fmt.Errorf("%w: phase %d (%s): %d rates for %d regions", ErrStory, i, p.Name, len(p.Rates), len(s.Regions))
		}
		for _, r := range p.Rates {
			if !(r >= 0) || r > MaxRate {
				return fmt.Errorf("%w: phase %d (%s): rate %v, want 0 to %d", ErrStory, i, p.Name, r, MaxRate)
			}
		}
	}
	return nil
}

// Length is the sum of the phases' lengths.
func (s *Story) Length() time.Duration {
	var d time.Duration
	for _, p := range s.Phases {
		d += p.For
	}
	return d
}

// At returns the phase in force at offset t (the last one after the end).
func (s *Story) At(t time.Duration) (int, Phase) {
	for i, p := range s.Phases {
		if t < p.For {
			return i, p
		}
		t -= p.For
	}
	return len(s.Phases) - 1, s.Phases[len(s.Phases)-1]
}

// PartnerStory is the demo's story over d: three regions offering a steady
// 20% of the budget each, then a partner campaign multiplying the first
// region's demand tenfold (well above the whole budget), then that region
// failing over to the second, which receives its traffic. The global
// budget is C = r = budget per second.
func PartnerStory(d time.Duration, budget float64) Story {
	steady := 0.2 * budget
	campaign := 10 * steady
	third := d / 3
	return Story{
		Regions: []string{"us-east", "eu-west", "ap-south"},
		Phases: []Phase{
			{Name: "steady", For: third, Rates: []float64{steady, steady, steady}},
			{Name: "campaign x10 in us-east", For: third, Rates: []float64{campaign, steady, steady}},
			{Name: "us-east fails over to eu-west", For: d - 2*third, Rates: []float64{0, campaign + steady, steady}},
		},
		Policy:          "partner-api",
		Subject:         "partner-acme",
		Capacity:        int64(budget),
		RefillPerSecond: budget,
	}
}
