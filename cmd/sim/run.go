package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/sim"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// run parses args, runs the sweep and writes the report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var scenarios listFlag
	fs.Var(&scenarios, "scenario", "built-in scenario NAME or scenario FILE (repeatable; default all built-in: "+strings.Join(sim.Builtin(), ", ")+")")
	intervals := fs.String("intervals", "1s,5s,15s,60s,300s", "rebalance intervals to sweep")
	report := fs.Duration("report-interval", time.Second, "demand report interval")
	seed := fs.Uint64("seed", 1, "random seed")
	duration := fs.Duration("duration", 0, "simulated time per run (default: the scenario's, 1h for built-ins)")
	out := fs.String("out", "sim-out", "directory for report.json, report.csv, report.md and SVG plots")
	regions := fs.Int("regions", 0, "regions (default: the scenario's)")
	subjects := fs.Int("subjects", 0, "subjects (default: the scenario's)")
	algorithm := fs.String("algorithm", string(allocator.MaxMinFair), "allocator algorithm: static, proportional or maxmin")
	overcommit := fs.Float64("overcommit", 0, "overcommit ε")
	maxStep := fs.Float64("max-step", 0.25, "largest share change per round (0 = unlimited)")
	protocols := fs.String("protocol", "two-step,naive", "publish protocols to sweep: two-step, naive")
	delay := fs.Duration("propagation-delay", 300*time.Millisecond, "mean coordinator↔region delay")
	lost := fs.Float64("lost-reports", 0.01, "probability a demand report is lost")
	late := fs.Float64("late-reports", 0.01, "probability a demand report is one interval late")
	rules := fs.String("share-rules", "on", "the nodes' rules on shares that grew (new token buckets at the lowest share of the last refill time, window counts at the lowest share since the window began): on, off (as nodes decided before them), or both")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the sweep to this file")
	leases := addLeaseFlags(fs, seed)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *leases.run != "" {
		return runLeases(ctx, leases, stdout)
	}
	if len(scenarios) == 0 {
		scenarios = sim.Builtin()
	}
	ivs, err := durations("-intervals", *intervals)
	if err != nil {
		return err
	}
	if len(ivs) == 0 {
		return fmt.Errorf("-intervals: no interval given")
	}
	var protos []sim.Protocol
	for _, p := range strings.Split(*protocols, ",") {
		protos = append(protos, sim.Protocol(strings.TrimSpace(p)))
	}
	var noRules []bool
	switch *rules {
	case "on":
		noRules = []bool{false}
	case "off":
		noRules = []bool{true}
	case "both":
		noRules = []bool{false, true}
	default:
		return fmt.Errorf("-share-rules: %q is not on, off or both", *rules)
	}
	params := &allocator.Params{Algorithm: allocator.Algorithm(*algorithm), Overcommit: *overcommit, MaxStep: *maxStep, DeadBand: 0.01}
	if err := params.Validate(); err != nil {
		return err
	}
	var cfgs []sim.Config
	for _, name := range scenarios {
		sc, err := sim.LoadScenario(name)
		if err != nil {
			return err
		}
		for _, iv := range ivs {
			for _, p := range protos {
				for _, nr := range noRules {
					cfgs = append(cfgs, sim.Config{Scenario: sc, Regions: *regions, Subjects: *subjects, Duration: *duration, Seed: *seed,
						Allocator: params, Protocol: p, RebalanceInterval: iv, ReportInterval: *report, PropagationDelay: *delay,
						LostReports: *lost, LateReports: *late, NoShareRules: nr})
				}
			}
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	bar := isTerminal(stderr)
	if bar {
		progress(stderr, 0, len(cfgs))
	}
	results, err := sim.Sweep(ctx, cfgs, func(done, total int) {
		if bar {
			progress(stderr, done, total)
		}
	})
	if err != nil {
		return err
	}
	if bar {
		fmt.Fprintln(stderr)
	}
	if err := sim.WriteTable(stdout, results); err != nil {
		return err
	}
	if err := sim.WriteReport(*out, results); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report written to %s\n", *out)
	return nil
}

func progress(w io.Writer, done, total int) {
	const width = 30
	n := done * width / max(total, 1)
	fmt.Fprintf(w, "\r[%s%s] %d/%d runs", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
