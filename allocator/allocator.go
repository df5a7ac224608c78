package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Algorithm names how the free budget is divided among regions.
type Algorithm string

// The algorithms. The empty Algorithm means MaxMinFair.
const (
	// Static divides the budget by weight and ignores demand.
	Static Algorithm = "static"
	// Proportional divides the budget in proportion to demand.
	Proportional Algorithm = "proportional"
	// MaxMinFair water-fills by demand and weight; spare budget is spread
	// by weight so none sits idle.
	MaxMinFair Algorithm = "maxmin"
)

// Tolerance is the slack callers should allow when they re-add shares in
// their own order: Split sums in a canonical order and keeps Σ ≤ 1 + ε
// exactly there, other orders may differ in the last bits.
const Tolerance = 1e-9

// MaxRegions bounds the number of regions one call accepts, and so the
// regions of one allocation (package plan and the coordinator use it).
const MaxRegions = 256

// ErrInvalid is wrapped by every error about bad input.
var ErrInvalid = errors.New("allocator: invalid input")

// Region is one region's input to a split.
type Region struct {
	// Name identifies the region; unique and non-empty.
	Name string
	// Demand is the smoothed demand as a fraction of the policy's global
	// rate (1 = the whole budget), >= 0.
	Demand float64
	// Weight is > 0; 0 means 1.
	Weight float64
	// Min is the guaranteed minimum share (the region's safe share), always
	// kept. Σ Min ≤ 1 is validated.
	Min float64
	// Max caps the share; 0 means no cap. A cap must be ≥ Min.
	Max float64
	// Pinned says an operator fixed the share at Pin exactly.
	Pinned bool
	// Pin is the pinned share, Min ≤ Pin ≤ Max (when capped).
	Pin float64
	// Live is false when the region's lease expired: it gets exactly Min and
	// its demand is ignored.
	Live bool
	// Current is the share in force now (for the step limit and dead band).
	Current float64
}

// Params are the policy-level settings of a split.
type Params struct {
	// Algorithm divides the free budget; empty means MaxMinFair.
	Algorithm Algorithm
	// Overcommit is ε ≥ 0: shares may sum to 1+ε.
	Overcommit float64
	// MaxStep is the largest change of one region's share per round;
	// 0 means unlimited.
	MaxStep float64
	// DeadBand: a region whose target differs from Current by less keeps
	// Current. 0 disables it.
	DeadBand float64
}

// Validate reports whether p is usable.
func (p Params) Validate() error {
	switch p.Algorithm {
	case "", Static, Proportional, MaxMinFair:
	default:
		return fmt.Errorf("%w: unknown algorithm %q (want %q, %q or %q)", ErrInvalid, p.Algorithm, Static, Proportional, MaxMinFair)
	}
	if err := nonNegative("overcommit", p.Overcommit); err != nil {
		return err
	}
	if err := nonNegative("max step", p.MaxStep); err != nil {
		return err
	}
	return nonNegative("dead band", p.DeadBand)
}

func nonNegative(what string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%w: %s %v must be a finite number >= 0", ErrInvalid, what, v)
	}
	return nil
}

// Budget returns 1 + ε, the most the shares may sum to.
func (p Params) Budget() float64 { return 1 + p.Overcommit }

// Sum adds shares in the given order.
func Sum(shares []float64) float64 {
	s := 0.0
	for _, v := range shares {
		s += v
	}
	return s
}

// Smooth returns the exponential moving average prev + α·(observed − prev).
// alpha ≥ 1 returns observed; alpha ≤ 0, a NaN alpha or a NaN or infinite
// observation returns prev unchanged; a NaN prev returns observed.
func Smooth(prev, observed, alpha float64) float64 {
	switch {
	case math.IsNaN(observed) || math.IsInf(observed, 0) || math.IsNaN(alpha) || alpha <= 0:
		return prev
	case alpha >= 1 || math.IsNaN(prev) || math.IsInf(prev, 0):
		return observed
	}
	return prev + alpha*(observed-prev)
}

// region is a validated Region in canonical (name) order.
type region struct {
	Region
	index int // position in the caller's slice
	cap   float64
}

// prepare validates the input and returns the regions sorted by name.
func prepare(p Params, regions []Region) ([]region, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if len(regions) == 0 {
		return nil, fmt.Errorf("%w: no regions", ErrInvalid)
	}
	if len(regions) > MaxRegions {
		return nil, fmt.Errorf("%w: %d regions, at most %d", ErrInvalid, len(regions), MaxRegions)
	}
	budget := p.Budget()
	rs := make([]region, len(regions))
	for i, r := range regions {
		if r.Name == "" {
			return nil, fmt.Errorf("%w: region %d has no name", ErrInvalid, i)
		}
		for _, f := range []struct {
			what string
			v    float64
		}{{"demand", r.Demand}, {"weight", r.Weight}, {"min", r.Min}, {"max", r.Max}, {"pin", r.Pin}, {"current", r.Current}} {
			if err := nonNegative(f.what, f.v); err != nil {
				return nil, fmt.Errorf("region %q: %w", r.Name, err)
			}
		}
		if r.Weight == 0 {
			r.Weight = 1
		}
		if r.Min > 1 {
			return nil, fmt.Errorf("%w: region %q: min %v above 1", ErrInvalid, r.Name, r.Min)
		}
		c := budget
		if r.Max > 0 {
			if r.Max < r.Min {
				return nil, fmt.Errorf("%w: region %q: max %v below min %v", ErrInvalid, r.Name, r.Max, r.Min)
			}
			c = math.Min(r.Max, budget)
		}
		if r.Pinned && (r.Pin < r.Min || r.Pin > c) {
			return nil, fmt.Errorf("%w: region %q: pin %v outside [min %v, max %v]", ErrInvalid, r.Name, r.Pin, r.Min, c)
		}
		rs[i] = region{Region: r, index: i, cap: c}
	}
	sort.Slice(rs, func(a, b int) bool { return rs[a].Name < rs[b].Name })
	sumMin, fixed := 0.0, 0.0
	for i := range rs {
		if i > 0 && rs[i].Name == rs[i-1].Name {
			return nil, fmt.Errorf("%w: duplicate region %q", ErrInvalid, rs[i].Name)
		}
		sumMin += rs[i].Min
		if rs[i].Live && rs[i].Pinned {
			fixed += rs[i].Pin
		} else {
			fixed += rs[i].Min
		}
	}
	if sumMin > 1+Tolerance {
		return nil, fmt.Errorf("%w: minimum shares sum to %v, above 1", ErrInvalid, sumMin)
	}
	if fixed > budget+Tolerance {
		return nil, fmt.Errorf("%w: pins plus the other regions' minimums sum to %v, above 1+ε = %v", ErrInvalid, fixed, budget)
	}
	return rs, nil
}

// Target returns the ideal split, before the step limit and dead band, in
// the order of regions. Dead regions get Min, live pinned ones Pin, the
// rest divide the remaining budget by the algorithm.
func Target(p Params, regions []Region) ([]float64, error) {
	rs, err := prepare(p, regions)
	if err != nil {
		return nil, err
	}
	t := target(p, rs)
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[r.index] = t[i]
	}
	return out, nil
}

// target works in canonical order.
func target(p Params, rs []region) []float64 {
	t := make([]float64, len(rs))
	rest := p.Budget()
	var free []int
	for i, r := range rs {
		switch {
		case !r.Live:
			t[i] = r.Min
		case r.Pinned:
			t[i] = r.Pin
		default:
			free = append(free, i)
			continue
		}
		rest -= t[i]
	}
	if len(free) == 0 {
		return t
	}
	terms := make([]term, len(free))
	switch p.Algorithm {
	case Static:
		for k, i := range free {
			terms[k] = term{slope: rs[i].Weight, lo: rs[i].Min, hi: rs[i].cap}
		}
		solve(terms, rest)
	case Proportional:
		total := 0.0
		for _, i := range free {
			total += rs[i].Demand
		}
		for k, i := range free {
			s := rs[i].Demand
			if total == 0 {
				s = rs[i].Weight
			}
			terms[k] = term{slope: s, lo: rs[i].Min, hi: rs[i].cap}
		}
		solve(terms, rest)
	default: // MaxMinFair
		for k, i := range free {
			hi := math.Min(rs[i].cap, math.Max(rs[i].Min, rs[i].Demand))
			terms[k] = term{slope: rs[i].Weight, lo: rs[i].Min, hi: hi}
		}
		if left := rest - solve(terms, rest); left > 0 {
			for k, i := range free {
				v := terms[k].value
				terms[k] = term{base: v, slope: rs[i].Weight, lo: v, hi: rs[i].cap}
			}
			solve(terms, rest)
		}
	}
	for k, i := range free {
		t[i] = terms[k].value
	}
	fit(t, rs, p.Budget(), func(i int) float64 { return rs[i].Min })
	return t
}

// term is clamp(base + λ·slope, lo, hi), lo ≤ hi, slope ≥ 0.
type term struct {
	base, slope, lo, hi float64
	value               float64 // set by solve
}

func (t *term) at(lambda float64) float64 {
	return math.Min(t.hi, math.Max(t.lo, t.base+lambda*t.slope))
}

// solve finds λ ≥ 0 with Σ term(λ) = total, or the closest the terms reach,
// stores each term's value and returns their sum.
func solve(terms []term, total float64) float64 {
	sumAt := func(lambda float64) float64 {
		s := 0.0
		for k := range terms {
			s += terms[k].at(lambda)
		}
		return s
	}
	// Breakpoints: where a term leaves lo or reaches hi.
	bps := []float64{0}
	for _, t := range terms {
		if t.slope <= 0 {
			continue
		}
		for _, v := range []float64{(t.lo - t.base) / t.slope, (t.hi - t.base) / t.slope} {
			if v > 0 && !math.IsInf(v, 0) {
				bps = append(bps, v)
			}
		}
	}
	sort.Float64s(bps)
	lambda := bps[len(bps)-1] // every term at its cap, unless a smaller λ reaches total
	prev, prevSum := 0.0, sumAt(0)
	if prevSum >= total {
		lambda = 0
	} else {
		for _, b := range bps[1:] {
			s := sumAt(b)
			if s >= total {
				lambda = b
				if s > prevSum {
					lambda = prev + (b-prev)*(total-prevSum)/(s-prevSum)
				}
				break
			}
			prev, prevSum = b, s
		}
	}
	sum := 0.0
	for k := range terms {
		terms[k].value = terms[k].at(lambda)
		sum += terms[k].value
	}
	return sum
}

// fit lowers shares until Σ ≤ budget in canonical order, taking the excess
// from the share with the most room above floor(i). It only corrects
// rounding and the cases documented on Split.
func fit(s []float64, rs []region, budget float64, floor func(i int) float64) {
	for iter := 0; iter < 2*len(s)+4; iter++ {
		excess := Sum(s) - budget
		if excess <= 0 {
			return
		}
		best, room := -1, 0.0
		for i := range s {
			if rs[i].Live && rs[i].Pinned || !rs[i].Live {
				continue
			}
			if r := s[i] - floor(i); r > room {
				best, room = i, r
			}
		}
		if best < 0 {
			return // only fixed shares left; validated to fit within Tolerance
		}
		s[best] -= math.Min(room, excess)
		if s[best] < floor(best) {
			s[best] = floor(best)
		}
	}
}

// Split returns the new shares, in the order of regions: each free region
// moves from Current toward its target (see Target) by at most MaxStep and
// never past it, keeps Current inside the dead band, and growth is scaled
// down when the shrinks that the step limit allows leave too little room.
// Dead regions get exactly Min and live pinned regions exactly Pin at once.
// See the package documentation for the guarantees.
func Split(p Params, regions []Region) ([]float64, error) {
	rs, err := prepare(p, regions)
	if err != nil {
		return nil, err
	}
	t := target(p, rs)
	budget := p.Budget()
	n := make([]float64, len(rs))
	floor := make([]float64, len(rs)) // the share without growth
	for i, r := range rs {
		if !r.Live || r.Pinned {
			n[i], floor[i] = t[i], t[i]
			continue
		}
		cur := math.Min(math.Max(r.Current, r.Min), r.cap)
		d := t[i] - r.Current
		switch {
		case math.Abs(d) < p.DeadBand:
			n[i] = cur
		case p.MaxStep > 0 && d > p.MaxStep:
			n[i] = math.Max(r.Current+p.MaxStep, r.Min)
		case p.MaxStep > 0 && d < -p.MaxStep:
			n[i] = math.Min(r.Current-p.MaxStep, r.cap)
		default:
			n[i] = t[i]
		}
		floor[i] = math.Min(n[i], cur)
	}
	sum, growth := 0.0, 0.0
	for i := range n {
		sum += n[i]
		growth += n[i] - floor[i]
	}
	if excess := sum - budget; excess > 0 {
		if growth > 0 {
			g := math.Max(0, 1-excess/growth)
			for i := range n {
				n[i] = floor[i] + g*(n[i]-floor[i])
			}
		}
		// Recompute rather than subtract: rounding must not trigger the
		// extra shrink when the shares without growth already fit.
		if excess = Sum(floor) - budget; excess > 0 {
			copy(n, floor)
			// Current itself broke the budget: shrink the shares above
			// their target further, by a common fraction of the way left.
			above := 0.0
			for i := range n {
				if d := n[i] - t[i]; d > 0 {
					above += d
				}
			}
			if above > 0 {
				h := math.Min(1, excess/above)
				for i := range n {
					if d := n[i] - t[i]; d > 0 {
						n[i] -= h * d
					}
				}
			}
		}
	}
	// Rounding may leave Σ a few ulps above the budget: take that from
	// growth first, so that a region held by the dead band does not creep.
	fit(n, rs, budget, func(i int) float64 { return floor[i] })
	fit(n, rs, budget, func(i int) float64 { return math.Max(rs[i].Min, math.Min(t[i], floor[i])) })
	fit(n, rs, budget, func(i int) float64 { return rs[i].Min })
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[r.index] = n[i]
	}
	return out, nil
}

// Check reports whether shares satisfy the invariants for p and regions:
// Σ ≤ 1 + ε (within Tolerance), live regions at or above Min, pins exact,
// dead regions exactly Min. The coordinator and the simulator use it as an
// assertion on what they publish.
func Check(p Params, regions []Region, shares []float64) error {
	if len(shares) != len(regions) {
		return fmt.Errorf("%w: %d shares for %d regions", ErrInvalid, len(shares), len(regions))
	}
	sum := 0.0
	for i, r := range regions {
		s := shares[i]
		if math.IsNaN(s) || s < 0 {
			return fmt.Errorf("%w: region %q: share %v", ErrInvalid, r.Name, s)
		}
		sum += s
		switch {
		case !r.Live && math.Abs(s-r.Min) > Tolerance:
			return fmt.Errorf("%w: dead region %q has share %v, want its minimum %v", ErrInvalid, r.Name, s, r.Min)
		case r.Live && r.Pinned && math.Abs(s-r.Pin) > Tolerance:
			return fmt.Errorf("%w: pinned region %q has share %v, want %v", ErrInvalid, r.Name, s, r.Pin)
		case r.Live && s < r.Min-Tolerance:
			return fmt.Errorf("%w: region %q has share %v below its minimum %v", ErrInvalid, r.Name, s, r.Min)
		}
	}
	if sum > p.Budget()+Tolerance {
		return fmt.Errorf("%w: shares sum to %v, above 1+ε = %v", ErrInvalid, sum, p.Budget())
	}
	return nil
}
