package allocator_test

import (
	"fmt"
	"math"
	"testing"

	"pgregory.net/rapid"

	"github.com/quotacoord/quota/allocator"
)

// genParams draws valid Params.
func genParams(t *rapid.T) allocator.Params {
	return allocator.Params{
		Algorithm:  rapid.SampledFrom([]allocator.Algorithm{allocator.Static, allocator.Proportional, allocator.MaxMinFair, ""}).Draw(t, "alg"),
		Overcommit: rapid.SampledFrom([]float64{0, 0, .05, .5}).Draw(t, "eps"),
		MaxStep:    rapid.SampledFrom([]float64{0, .01, .1, .25}).Draw(t, "step"),
		DeadBand:   rapid.SampledFrom([]float64{0, 0, .001, .02}).Draw(t, "band"),
	}
}

// genRegions draws valid regions (Current left at 0).
func genRegions(t *rapid.T, p allocator.Params) []allocator.Region {
	n := rapid.IntRange(1, 6).Draw(t, "n")
	rs := make([]allocator.Region, n)
	fixed := 0.0
	for i := range rs {
		r := allocator.Region{
			Name:   fmt.Sprintf("r%d", i),
			Demand: rapid.Float64Range(0, 1.5).Draw(t, "demand"),
			Weight: rapid.SampledFrom([]float64{0, 1, 2, .5}).Draw(t, "weight"),
			Min:    rapid.Float64Range(0, 1/float64(n)).Draw(t, "min"),
			Live:   rapid.IntRange(0, 4).Draw(t, "live") > 0,
		}
		if rapid.Bool().Draw(t, "capped") {
			r.Max = r.Min + rapid.Float64Range(0, 1).Draw(t, "max")
		}
		rs[i] = r
		fixed += r.Min
	}
	for i := range rs {
		if !rs[i].Live || rapid.IntRange(0, 5).Draw(t, "pinned") > 0 {
			continue
		}
		hi := p.Budget()
		if rs[i].Max > 0 {
			hi = math.Min(hi, rs[i].Max)
		}
		pin := rapid.Float64Range(rs[i].Min, hi).Draw(t, "pin")
		if fixed-rs[i].Min+pin <= p.Budget() {
			rs[i].Pinned, rs[i].Pin = true, pin
			fixed += pin - rs[i].Min
		}
	}
	return rs
}

// settle gives regions a consistent Current: the split for other demands.
func settle(t *rapid.T, p allocator.Params, rs []allocator.Region) {
	prev := make([]allocator.Region, len(rs))
	copy(prev, rs)
	for i := range prev {
		prev[i].Demand = rapid.Float64Range(0, 1).Draw(t, "prevDemand")
		prev[i].Current = 0
	}
	q := p
	q.MaxStep, q.DeadBand = 0, 0
	s, err := allocator.Split(q, prev)
	if err != nil {
		t.Fatalf("settle: %v", err)
	}
	for i := range rs {
		rs[i].Current = s[i]
	}
}

func TestPropertyInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams(t)
		rs := genRegions(t, p)
		for i := range rs { // arbitrary, possibly inconsistent current shares
			rs[i].Current = rapid.Float64Range(0, 1.2).Draw(t, "current")
		}
		for _, f := range []func(allocator.Params, []allocator.Region) ([]float64, error){allocator.Split, allocator.Target} {
			s, err := f(p, rs)
			if err != nil {
				t.Fatalf("valid input rejected: %v", err)
			}
			if err := allocator.Check(p, rs, s); err != nil {
				t.Fatal(err)
			}
			if sum := allocator.Sum(s); sum > p.Budget() {
				t.Fatalf("Σ = %v above %v even in canonical order", sum, p.Budget())
			}
			for i, r := range rs {
				if r.Max > 0 && s[i] > r.Max+allocator.Tolerance {
					t.Fatalf("region %s: %v above its cap %v", r.Name, s[i], r.Max)
				}
			}
		}
	})
}

func TestPropertyTowardTarget(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams(t)
		rs := genRegions(t, p)
		settle(t, p, rs)
		target, err := allocator.Target(p, rs)
		if err != nil {
			t.Fatal(err)
		}
		s, err := allocator.Split(p, rs)
		if err != nil {
			t.Fatal(err)
		}
		const tol = 1e-9
		for i, r := range rs {
			if !r.Live || r.Pinned {
				continue
			}
			lo, hi := math.Min(r.Current, target[i]), math.Max(r.Current, target[i])
			if s[i] < lo-tol || s[i] > hi+tol {
				t.Fatalf("region %s: %v not between current %v and target %v", r.Name, s[i], r.Current, target[i])
			}
			if p.MaxStep > 0 && math.Abs(s[i]-r.Current) > p.MaxStep+tol {
				t.Fatalf("region %s: moved %v → %v, more than step %v", r.Name, r.Current, s[i], p.MaxStep)
			}
			if math.Abs(target[i]-r.Current) < p.DeadBand && s[i] != r.Current {
				t.Fatalf("region %s: inside the dead band but moved %v → %v (target %v)", r.Name, r.Current, s[i], target[i])
			}
		}
	})
}

func TestPropertyPermutation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams(t)
		rs := genRegions(t, p)
		for i := range rs {
			rs[i].Current = rapid.Float64Range(0, 1).Draw(t, "current")
		}
		perm := rapid.Permutation(rs).Draw(t, "perm")
		a, err := allocator.Split(p, rs)
		if err != nil {
			t.Fatal(err)
		}
		b, err := allocator.Split(p, perm)
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]float64{}
		for i, r := range rs {
			byName[r.Name] = a[i]
		}
		for i, r := range perm {
			if byName[r.Name] != b[i] {
				t.Fatalf("region %s: %v in one order, %v in another", r.Name, byName[r.Name], b[i])
			}
		}
	})
}

func TestPropertyFixedPoint(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams(t)
		rs := genRegions(t, p)
		settle(t, p, rs)
		bound := 3
		if p.MaxStep > 0 {
			bound += 2 * int(math.Ceil(p.Budget()/p.MaxStep))
		}
		for round := 0; ; round++ {
			s, err := allocator.Split(p, rs)
			if err != nil {
				t.Fatal(err)
			}
			same := true
			for i := range rs {
				same = same && s[i] == rs[i].Current
				rs[i].Current = s[i]
			}
			if same {
				return
			}
			if round > bound {
				t.Fatalf("no fixed point after %d rounds: %v", round, s)
			}
		}
	})
}
