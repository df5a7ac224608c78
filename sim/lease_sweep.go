package sim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// leaseScenarios are the built-in lease runs.
var leaseScenarios = map[string]LeaseConfig{
	// A region's bucket (C = 60, r = 30/s) leased to 4 Envoys, offered 3×
	// its refill, the load moving between them every 10 s, assignments
	// taking up to the whole margin to arrive.
	"envoys-moving": {Capacity: 60, Refill: 30, Consumers: 4, TTL: 3 * time.Second, ReportInterval: time.Second,
		Margin: time.Second, Delay: time.Second, Reserve: 0.1, Offered: 3, Move: 10 * time.Second, Duration: 10 * time.Minute},
	// envoys-moving with its 4 Envoys on 2 nodes of the region, each node
	// splitting among its own two without seeing the other's demand.
	"envoys-two-nodes": {Capacity: 60, Refill: 30, Consumers: 4, Nodes: 2, TTL: 3 * time.Second, ReportInterval: time.Second,
		Margin: time.Second, Delay: time.Second, Reserve: 0.1, Offered: 3, Move: 10 * time.Second, Duration: 10 * time.Minute},
	// The same bucket under a steady load at its refill, spread evenly:
	// what the reserve and the whole-second shapes cost when nothing moves.
	"envoys-steady": {Capacity: 60, Refill: 30, Consumers: 4, TTL: 3 * time.Second, ReportInterval: time.Second,
		Margin: time.Second, Delay: 500 * time.Millisecond, Reserve: 0.1, Offered: 1, Duration: 10 * time.Minute},
}

// BuiltinLeases returns the names of the built-in lease runs, sorted.
func BuiltinLeases() []string {
	names := make([]string, 0, len(leaseScenarios))
	for n := range leaseScenarios {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// LeaseScenario returns the built-in lease run called name.
func LeaseScenario(name string) (LeaseConfig, error) {
	c, ok := leaseScenarios[name]
	if !ok {
		return LeaseConfig{}, fmt.Errorf("%w: no built-in lease run %q (have %s)", ErrLeaseConfig, name, strings.Join(BuiltinLeases(), ", "))
	}
	c.Name = name
	return c, nil
}

// LeaseSweep is a grid of lease runs around Base; an empty list keeps
// Base's value.
type LeaseSweep struct {
	Base      LeaseConfig
	TTLs      []time.Duration
	Intervals []time.Duration
	Consumers []int
	Nodes     []int
}

// Configs returns the grid's runs in order (nodes, consumers, interval,
// TTL), and names the points it leaves out because their TTL is not above
// the interval plus the margin (a renewal could arrive after the
// assignment ended: the consumer would deny in between) or they have
// more nodes than consumers.
func (s LeaseSweep) Configs() (cfgs []LeaseConfig, skipped []string) {
	ttls, ivs, ns, nodes := s.TTLs, s.Intervals, s.Consumers, s.Nodes
	if len(ttls) == 0 {
		ttls = []time.Duration{s.Base.TTL}
	}
	if len(ivs) == 0 {
		ivs = []time.Duration{s.Base.ReportInterval}
	}
	if len(ns) == 0 {
		ns = []int{s.Base.Consumers}
	}
	if len(nodes) == 0 {
		nodes = []int{max(1, s.Base.Nodes)}
	}
	margin := s.Base.Margin
	if margin == 0 {
		margin = time.Second
	}
	for _, nn := range nodes {
		for _, n := range ns {
			if nn > n {
				skipped = append(skipped, fmt.Sprintf("%d nodes > %d consumers", nn, n))
				continue
			}
			for _, iv := range ivs {
				for _, ttl := range ttls {
					if ttl <= iv+margin {
						skipped = append(skipped, fmt.Sprintf("ttl %v ≤ interval %v + margin %v", ttl, iv, margin))
						continue
					}
					c := s.Base
					c.TTL, c.ReportInterval, c.Consumers, c.Nodes = ttl, iv, n, nn
					cfgs = append(cfgs, c)
				}
			}
		}
	}
	return cfgs, skipped
}

// SweepLeases runs every point of s in order; it stops early when ctx ends.
func SweepLeases(ctx context.Context, s LeaseSweep) ([]*LeaseResult, []string, error) {
	cfgs, skipped := s.Configs()
	out := make([]*LeaseResult, 0, len(cfgs))
	for _, c := range cfgs {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		r, err := RunLeases(c)
		if err != nil {
			return nil, nil, fmt.Errorf("sim: lease run %s (ttl %v, interval %v, %d consumers, %d nodes): %w", c.Name, c.TTL, c.ReportInterval, c.Consumers, c.Nodes, err)
		}
		out = append(out, r)
	}
	return out, skipped, nil
}

// WriteLeaseTable writes one row per lease run: its TTL, interval,
// consumers and nodes, the overshoot (0 or the run breaks the bound), under-admission
// against one ideal bucket, and the lease calls.
func WriteLeaseTable(w io.Writer, results []*LeaseResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "lease run\tconsumers\tnodes\tinterval\tttl\tovershoot\tunder-admission\tadmitted\tideal\tfresh leases\trenewals\trefusals")
	for _, r := range results {
		c := r.Config
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%v\t%.4f\t%.1f%%\t%d\t%d\t%d\t%d\t%d\n", c.Name, c.Consumers, c.Nodes, c.ReportInterval, c.TTL,
			r.Overshoot, 100*r.UnderAdmission, r.Admitted, r.Ideal, r.Grants, r.Renewals, r.Refusals)
	}
	return tw.Flush()
}
