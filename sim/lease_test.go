package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestLeaseSweepNoOvershoot: the built-in moving-demand run over a small
// grid of TTLs, reporting intervals and consumer counts never admits more
// than the region's bucket alone in any window, and still admits most of
// what an ideal bucket would.
func TestLeaseSweepNoOvershoot(t *testing.T) {
	base, err := LeaseScenario("envoys-moving")
	if err != nil {
		t.Fatal(err)
	}
	base.Duration = 2 * time.Minute
	sw := LeaseSweep{Base: base, TTLs: []time.Duration{2 * time.Second, 3 * time.Second, 6 * time.Second},
		Intervals: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}, Consumers: []int{2, 8}}
	results, skipped, err := SweepLeases(context.Background(), sw)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 12 || len(skipped) != 6 {
		t.Fatalf("%d runs, %d skipped; want 12 and 6", len(results), len(skipped))
	}
	var b strings.Builder
	if err := WriteLeaseTable(&b, results); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	for _, r := range results {
		c := r.Config
		if r.Overshoot != 0 {
			t.Errorf("ttl %v interval %v consumers %d: overshoot %.4f", c.TTL, c.ReportInterval, c.Consumers, r.Overshoot)
		}
		// A replaced assignment stays counted to its own end (TTL and
		// margin), so long TTLs with many consumers and short intervals
		// give up most: two thirds at 6 s, 8 consumers, 500 ms.
		if r.Grants == 0 || r.UnderAdmission > 0.7 {
			t.Errorf("ttl %v interval %v consumers %d: %d fresh leases, under-admission %.2f", c.TTL, c.ReportInterval, c.Consumers, r.Grants, r.UnderAdmission)
		}
	}
}

// TestLeaseSteadyRenews: under a steady, even load the assignments stop
// changing: almost every round renews, and the under-admission is about
// the reserve.
func TestLeaseSteadyRenews(t *testing.T) {
	c, err := LeaseScenario("envoys-steady")
	if err != nil {
		t.Fatal(err)
	}
	c.Duration = time.Minute
	r, err := RunLeases(c)
	if err != nil {
		t.Fatal(err)
	}
	if r.Overshoot != 0 {
		t.Errorf("overshoot %.4f", r.Overshoot)
	}
	if r.Renewals < 4*r.Grants {
		t.Errorf("%d renewals, %d fresh leases: want mostly renewals", r.Renewals, r.Grants)
	}
	if r.UnderAdmission < 0.05 || r.UnderAdmission > 0.3 {
		t.Errorf("under-admission %.3f, want about the reserve (0.1)", r.UnderAdmission)
	}
}

// TestLeaseRunDeterministic: a config gives the same result every time.
func TestLeaseRunDeterministic(t *testing.T) {
	c, err := LeaseScenario("envoys-moving")
	if err != nil {
		t.Fatal(err)
	}
	c.Duration = 30 * time.Second
	a, err := RunLeases(c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := RunLeases(c)
	if err != nil {
		t.Fatal(err)
	}
	if *a != *b {
		t.Errorf("two runs differ: %+v and %+v", a, b)
	}
}

func TestLeaseConfigErrors(t *testing.T) {
	good, err := LeaseScenario("envoys-moving")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*LeaseConfig)
	}{
		{"no capacity", func(c *LeaseConfig) { c.Capacity = 0 }},
		{"no refill", func(c *LeaseConfig) { c.Refill = 0 }},
		{"no consumers", func(c *LeaseConfig) { c.Consumers = 0 }},
		{"too many consumers", func(c *LeaseConfig) { c.Consumers = MaxLeaseConsumers + 1 }},
		{"more nodes than consumers", func(c *LeaseConfig) { c.Nodes = c.Consumers + 1 }},
		{"negative nodes", func(c *LeaseConfig) { c.Nodes = -1 }},
		{"fractional ttl", func(c *LeaseConfig) { c.TTL = 3500 * time.Millisecond }},
		{"ttl within interval and margin", func(c *LeaseConfig) { c.TTL = 2 * time.Second }},
		{"delay over margin", func(c *LeaseConfig) { c.Delay = 2 * time.Second }},
		{"reserve", func(c *LeaseConfig) { c.Reserve = 1 }},
		{"interval off the tick", func(c *LeaseConfig) { c.ReportInterval = 1050 * time.Millisecond }},
		{"duration", func(c *LeaseConfig) { c.Duration = 8 * 24 * time.Hour }},
	} {
		c := good
		tc.mod(&c)
		if _, err := RunLeases(c); !errors.Is(err, ErrLeaseConfig) {
			t.Errorf("%s: error %v, want ErrLeaseConfig", tc.name, err)
		}
	}
	if _, err := LeaseScenario("nope"); !errors.Is(err, ErrLeaseConfig) {
		t.Errorf("unknown built-in: %v", err)
	}
}

// TestLeaseNodesNoOvershoot: the moving-demand run with its consumers on
// 1, 2 and 4 nodes of the region (each node splits its demand part of the
// leasable rate among its own consumers, all leasing from the one bucket)
// never admits more than the region's bucket alone; the table shows what
// the nodes cost.
func TestLeaseNodesNoOvershoot(t *testing.T) {
	base, err := LeaseScenario("envoys-two-nodes")
	if err != nil {
		t.Fatal(err)
	}
	base.Duration = 2 * time.Minute
	sw := LeaseSweep{Base: base, Consumers: []int{2, 8}, Nodes: []int{1, 2, 4}}
	results, skipped, err := SweepLeases(context.Background(), sw)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 5 || len(skipped) != 1 {
		t.Fatalf("%d runs, %d skipped (%v); want 5 and 1 (4 nodes > 2 consumers)", len(results), len(skipped), skipped)
	}
	var b strings.Builder
	if err := WriteLeaseTable(&b, results); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	byNodes := map[int]float64{}
	for _, r := range results {
		c := r.Config
		if r.Overshoot != 0 {
			t.Errorf("%d consumers on %d nodes: overshoot %.4f", c.Consumers, c.Nodes, r.Overshoot)
		}
		if r.Grants == 0 || r.Admitted == 0 {
			t.Errorf("%d consumers on %d nodes: %d fresh leases, %d admitted", c.Consumers, c.Nodes, r.Grants, r.Admitted)
		}
		if c.Consumers == 8 {
			byNodes[c.Nodes] = r.UnderAdmission
		}
	}
	if byNodes[1] == byNodes[4] {
		t.Errorf("8 consumers on 1 and on 4 nodes gave the same under-admission %.4f: the nodes are not modelled", byNodes[1])
	}
}
