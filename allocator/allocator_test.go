package allocator_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/quotacoord/quota/allocator"
)

const eps = 1e-12

func near(a, b []float64, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > tol {
			return false
		}
	}
	return true
}

func live(name string, demand float64) allocator.Region {
	return allocator.Region{Name: name, Demand: demand, Live: true}
}

func TestTarget(t *testing.T) {
	tests := []struct {
		name    string
		p       allocator.Params
		regions []allocator.Region
		want    []float64
	}{
		{"static equal", allocator.Params{Algorithm: allocator.Static},
			[]allocator.Region{live("a", 1), live("b", 0), live("c", 0)}, []float64{1. / 3, 1. / 3, 1. / 3}},
		{"static weights", allocator.Params{Algorithm: allocator.Static},
			[]allocator.Region{{Name: "a", Weight: 1, Live: true}, {Name: "b", Weight: 2, Live: true}, {Name: "c", Live: true}},
			[]float64{.25, .5, .25}},
		{"static with overcommit", allocator.Params{Algorithm: allocator.Static, Overcommit: .2},
			[]allocator.Region{live("a", 0), live("b", 0)}, []float64{.6, .6}},
		{"static min above weight share", allocator.Params{Algorithm: allocator.Static},
			[]allocator.Region{{Name: "a", Min: .6, Live: true}, live("b", 0), live("c", 0)}, []float64{.6, .2, .2}},
		{"proportional", allocator.Params{Algorithm: allocator.Proportional},
			[]allocator.Region{live("a", .1), live("b", .3), live("c", 0)}, []float64{.25, .75, 0}},
		{"proportional no demand uses weights", allocator.Params{Algorithm: allocator.Proportional},
			[]allocator.Region{live("a", 0), {Name: "b", Weight: 3, Live: true}}, []float64{.25, .75}},
		{"proportional with min", allocator.Params{Algorithm: allocator.Proportional},
			[]allocator.Region{{Name: "a", Min: .1, Live: true}, live("b", 1)}, []float64{.1, .9}},
		{"maxmin saturated", allocator.Params{Algorithm: allocator.MaxMinFair},
			[]allocator.Region{live("a", .1), live("b", .5), live("c", .8)}, []float64{.1, .45, .45}},
		{"maxmin spare by weight", allocator.Params{},
			[]allocator.Region{live("a", .1), live("b", .2), live("c", .1)}, []float64{.3, .4, .3}},
		{"maxmin weighted water level", allocator.Params{},
			[]allocator.Region{{Name: "a", Demand: 1, Weight: 3, Live: true}, live("b", 1)}, []float64{.75, .25}},
		{"maxmin cap leaves budget idle", allocator.Params{},
			[]allocator.Region{{Name: "a", Demand: 1, Max: .3, Live: true}, {Name: "b", Demand: 1, Max: .4, Live: true}}, []float64{.3, .4}},
		{"dead region gets min, demand ignored", allocator.Params{},
			[]allocator.Region{{Name: "a", Demand: 5, Min: .1}, live("b", .2), live("c", .2)}, []float64{.1, .45, .45}},
		{"pin", allocator.Params{},
			[]allocator.Region{{Name: "a", Demand: 1, Pinned: true, Pin: .5, Live: true}, live("b", 1), live("c", 0)}, []float64{.5, .5, 0}},
		{"dead pinned region gets min", allocator.Params{},
			[]allocator.Region{{Name: "a", Pinned: true, Pin: .5, Min: .05}, live("b", 1)}, []float64{.05, .95}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := allocator.Target(tc.p, tc.regions)
			if err != nil {
				t.Fatal(err)
			}
			if !near(got, tc.want, 1e-12) {
				t.Errorf("Target = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSplit(t *testing.T) {
	tests := []struct {
		name    string
		p       allocator.Params
		regions []allocator.Region
		want    []float64
	}{
		{"no limits reaches target", allocator.Params{},
			[]allocator.Region{{Name: "a", Demand: 1, Live: true, Current: .5}, {Name: "b", Live: true, Current: .5}}, []float64{1, 0}},
		{"step limit both ways", allocator.Params{MaxStep: .1},
			[]allocator.Region{{Name: "a", Demand: 1, Live: true, Current: .5}, {Name: "b", Live: true, Current: .5}}, []float64{.6, .4}},
		{"step never past target", allocator.Params{MaxStep: .3},
			[]allocator.Region{{Name: "a", Demand: .6, Live: true, Current: .5}, {Name: "b", Demand: .4, Live: true, Current: .5}}, []float64{.6, .4}},
		{"dead band keeps current", allocator.Params{DeadBand: .05},
			[]allocator.Region{{Name: "a", Demand: .52, Live: true, Current: .5}, {Name: "b", Demand: .48, Live: true, Current: .5}}, []float64{.5, .5}},
		{"dead band moves big changes", allocator.Params{DeadBand: .05},
			[]allocator.Region{{Name: "a", Demand: .7, Live: true, Current: .5}, {Name: "b", Demand: .3, Live: true, Current: .5}}, []float64{.7, .3}},
		{"half-way shrink scales growth", allocator.Params{MaxStep: .1},
			[]allocator.Region{{Name: "a", Live: true, Current: .8}, {Name: "b", Demand: .5, Live: true, Current: .1}, {Name: "c", Demand: .5, Live: true, Current: .1}},
			[]float64{.7, .15, .15}},
		{"below min raised at once", allocator.Params{MaxStep: .01},
			[]allocator.Region{{Name: "a", Min: .3, Live: true, Current: 0}, {Name: "b", Demand: 1, Live: true, Current: .7}}, []float64{.3, .7}},
		{"dead region drops to min at once", allocator.Params{MaxStep: .1},
			[]allocator.Region{{Name: "a", Min: .1, Current: .6}, {Name: "b", Demand: 1, Live: true, Current: .4}}, []float64{.1, .5}},
		{"new pin breaking current shrinks the rest beyond the step", allocator.Params{MaxStep: .1},
			[]allocator.Region{{Name: "a", Pinned: true, Pin: .8, Live: true, Current: .2}, {Name: "b", Demand: 1, Live: true, Current: .8}}, []float64{.8, .2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := allocator.Split(tc.p, tc.regions)
			if err != nil {
				t.Fatal(err)
			}
			if !near(got, tc.want, 1e-12) {
				t.Errorf("Split = %v, want %v", got, tc.want)
			}
			if err := allocator.Check(tc.p, tc.regions, got); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestSplitErrors(t *testing.T) {
	ok := []allocator.Region{live("a", .5), live("b", .5)}
	tests := []struct {
		name    string
		p       allocator.Params
		regions []allocator.Region
	}{
		{"empty", allocator.Params{}, nil},
		{"unknown algorithm", allocator.Params{Algorithm: "fifo"}, ok},
		{"negative overcommit", allocator.Params{Overcommit: -1}, ok},
		{"NaN step", allocator.Params{MaxStep: math.NaN()}, ok},
		{"infinite dead band", allocator.Params{DeadBand: math.Inf(1)}, ok},
		{"NaN demand", allocator.Params{}, []allocator.Region{live("a", math.NaN())}},
		{"negative demand", allocator.Params{}, []allocator.Region{live("a", -.1)}},
		{"negative weight", allocator.Params{}, []allocator.Region{{Name: "a", Weight: -1, Live: true}}},
		{"negative current", allocator.Params{}, []allocator.Region{{Name: "a", Current: -1, Live: true}}},
		{"no name", allocator.Params{}, []allocator.Region{{Live: true}}},
		{"duplicate", allocator.Params{}, []allocator.Region{live("a", 0), live("b", 0), live("a", 1)}},
		{"mins above 1", allocator.Params{Overcommit: 1}, []allocator.Region{{Name: "a", Min: .6}, {Name: "b", Min: .5}}},
		{"max below min", allocator.Params{}, []allocator.Region{{Name: "a", Min: .5, Max: .2}}},
		{"pin below min", allocator.Params{}, []allocator.Region{{Name: "a", Min: .5, Pinned: true, Pin: .2, Live: true}}},
		{"pin above cap", allocator.Params{}, []allocator.Region{{Name: "a", Max: .5, Pinned: true, Pin: .7, Live: true}}},
		{"pins break budget", allocator.Params{Overcommit: .1},
			[]allocator.Region{{Name: "a", Pinned: true, Pin: .7, Live: true}, {Name: "b", Pinned: true, Pin: .5, Live: true}}},
		{"pin plus minimums break budget", allocator.Params{},
			[]allocator.Region{{Name: "a", Pinned: true, Pin: .8, Live: true}, {Name: "b", Min: .3, Live: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for name, f := range map[string]func(allocator.Params, []allocator.Region) ([]float64, error){"Split": allocator.Split, "Target": allocator.Target} {
				got, err := f(tc.p, tc.regions)
				if !errors.Is(err, allocator.ErrInvalid) {
					t.Errorf("%s = %v, %v; want an allocator.ErrInvalid error", name, got, err)
				}
			}
		})
	}
	if _, err := allocator.Split(allocator.Params{}, make([]allocator.Region, allocator.MaxRegions+1)); err == nil {
		t.Error("Split accepted more than MaxRegions regions")
	}
}

func TestSmooth(t *testing.T) {
	tests := []struct {
		prev, obs, alpha, want float64
	}{
		{0, 1, .5, .5},
		{.5, .5, .3, .5},
		{.2, 1, 1, 1},
		{.2, 1, 2, 1},
		{.2, 1, 0, .2},
		{.2, 1, -1, .2},
		{.2, math.NaN(), .5, .2},
		{.2, math.Inf(1), .5, .2},
		{.2, 1, math.NaN(), .2},
		{math.NaN(), 1, .5, 1},
		{1, 0, .25, .75},
	}
	for _, tc := range tests {
		if got := allocator.Smooth(tc.prev, tc.obs, tc.alpha); math.Abs(got-tc.want) > eps {
			t.Errorf("Smooth(%v, %v, %v) = %v, want %v", tc.prev, tc.obs, tc.alpha, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	rs := []allocator.Region{{Name: "a", Min: .1, Live: true}, {Name: "b", Min: .2}, {Name: "c", Pinned: true, Pin: .3, Live: true}}
	tests := []struct {
		shares []float64
		ok     bool
	}{
		{[]float64{.5, .2, .3}, true},
		{[]float64{.6, .2, .3}, false},  // sum
		{[]float64{.05, .2, .3}, false}, // below min
		{[]float64{.4, .3, .3}, false},  // dead not at min
		{[]float64{.5, .2, .2}, false},  // pin
		{[]float64{.5, .2}, false},      // length
		{[]float64{math.NaN(), .2, .3}, false},
	}
	for _, tc := range tests {
		if err := allocator.Check(allocator.Params{}, rs, tc.shares); (err == nil) != tc.ok {
			t.Errorf("Check(%v) = %v, want ok=%v", tc.shares, err, tc.ok)
		}
	}
}

func ExampleSplit() {
	// Demand moved to eu; us still holds most of the budget. With a step
	// limit of 0.2 per round the shares walk toward the max-min fair
	// target (us 0.10, eu 0.85, ap at its minimum) without ever summing
	// above 1.
	p := allocator.Params{Algorithm: allocator.MaxMinFair, MaxStep: 0.2}
	regions := []allocator.Region{
		{Name: "us", Demand: 0.1, Min: 0.05, Live: true, Current: 0.8},
		{Name: "eu", Demand: 0.9, Min: 0.05, Live: true, Current: 0.1},
		{Name: "ap", Demand: 0.0, Min: 0.05, Live: true, Current: 0.1},
	}
	for round := 1; round <= 4; round++ {
		shares, err := allocator.Split(p, regions)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("round %d: us %.2f eu %.2f ap %.2f sum %.2f\n", round, shares[0], shares[1], shares[2], allocator.Sum(shares))
		for i := range regions {
			regions[i].Current = shares[i]
		}
	}
	// Output:
	// round 1: us 0.60 eu 0.30 ap 0.05 sum 0.95
	// round 2: us 0.40 eu 0.50 ap 0.05 sum 0.95
	// round 3: us 0.20 eu 0.70 ap 0.05 sum 0.95
	// round 4: us 0.10 eu 0.85 ap 0.05 sum 1.00
}
