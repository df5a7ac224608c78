package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/quotacoord/quota/sim"
)

// leaseFlags are the flags of a lease sweep (-leases).
type leaseFlags struct {
	run       *string
	ttls      *string
	intervals *string
	consumers *string
	nodes     *string
	duration  *time.Duration
	seed      *uint64
}

func addLeaseFlags(fs *flag.FlagSet, seed *uint64) *leaseFlags {
	return &leaseFlags{
		run: fs.String("leases", "", "run the lease layer instead of the region sweep: built-in lease run NAME ("+
			strings.Join(sim.BuiltinLeases(), ", ")+"), swept over -lease-ttls × -lease-intervals × -lease-consumers × -lease-nodes"),
		ttls:      fs.String("lease-ttls", "", "assignment TTLs to sweep, whole seconds (default: the run's)"),
		intervals: fs.String("lease-intervals", "", "consumer reporting intervals to sweep (default: the run's)"),
		consumers: fs.String("lease-consumers", "", "consumers per region to sweep (default: the run's)"),
		nodes:     fs.String("lease-nodes", "", "nodes per region serving the consumers to sweep, each splitting among its own (default: the run's)"),
		duration:  fs.Duration("lease-duration", 0, "simulated time per lease run (default: the run's)"),
		seed:      seed,
	}
}

// runLeases runs the lease sweep and prints its table: overshoot (must be
// 0) and under-admission per TTL, interval and consumer count.
func runLeases(ctx context.Context, lf *leaseFlags, stdout io.Writer) error {
	base, err := sim.LeaseScenario(*lf.run)
	if err != nil {
		return fmt.Errorf("-leases: %w", err)
	}
	base.Seed = *lf.seed
	if *lf.duration != 0 {
		base.Duration = *lf.duration
	}
	sw := sim.LeaseSweep{Base: base}
	if sw.TTLs, err = durations("-lease-ttls", *lf.ttls); err != nil {
		return err
	}
	if sw.Intervals, err = durations("-lease-intervals", *lf.intervals); err != nil {
		return err
	}
	if sw.Consumers, err = counts("-lease-consumers", *lf.consumers); err != nil {
		return err
	}
	if sw.Nodes, err = counts("-lease-nodes", *lf.nodes); err != nil {
		return err
	}
	results, skipped, err := sim.SweepLeases(ctx, sw)
	if err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("-leases: no valid point in the sweep (%s)", strings.Join(skipped, "; "))
	}
	if err := sim.WriteLeaseTable(stdout, results); err != nil {
		return err
	}
	for _, s := range skipped {
		fmt.Fprintf(stdout, "skipped: %s\n", s)
	}
	worst := 0.0
	for _, r := range results {
		worst = max(worst, r.Overshoot)
	}
	fmt.Fprintf(stdout, "worst overshoot %.4f (windows %v)\n", worst, sim.LeaseWindows)
	return nil
}

// counts parses a comma-separated list of positive counts; empty gives
// none.
func counts(flagName, list string) ([]int, error) {
	if list == "" {
		return nil, nil
	}
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive count", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// durations parses a comma-separated list of positive durations; empty
// gives none.
func durations(flagName, list string) ([]time.Duration, error) {
	if list == "" {
		return nil, nil
	}
	var out []time.Duration
	for _, s := range strings.Split(list, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive duration", flagName, s)
		}
		out = append(out, d)
	}
	return out, nil
}
