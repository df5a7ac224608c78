package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/quotacoord/quota/internal/demo"
	"github.com/quotacoord/quota/sim"
)

// run parses args and runs the demo, writing the live view and summary to
// stdout. Ctrl-C (ctx cancelled) stops the story early and still stops
// everything the demo started.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 90*time.Second, "length of the story (steady, campaign, failover: a third each)")
	serve := fs.Bool("serve", false, "keep the deployment serving after the story, printing its ports, until Ctrl-C")
	embedded := fs.Bool("embedded", false, "use the in-process store even when redis-server is installed")
	plain := fs.Bool("plain", false, "print plain lines instead of a refreshing table")
	chart := fs.String("chart", "", "write an SVG chart of the run (admitted rate and share per region against the global line, phases marked) to this path")
	rebalance := fs.Duration("rebalance-interval", time.Second, "the coordinator's rebalance interval")
	leaseTTL := fs.Duration("lease-ttl", 3*time.Second, "the regions' lease TTL: a failed region's share moves after it plus a 500ms skew margin")
	agree := fs.Bool("agree", false, "instead of the story, run a simulator scenario both in the simulator and live, and compare overshoot and under-admission")
	scenario := fs.String("scenario", "", "with -agree: a built-in simulator scenario name or a scenario file (default the 30 s hot-tenant-hop); at most 60 s and 200000 requests")
	seed := fs.Uint64("seed", 1, "with -agree: the scenario's random seed")
	smoothing := fs.Float64("smoothing", 1, "with -agree: demand smoothing α in (0, 1] of both the simulator and the coordinator; below 1 the simulator does not yet smooth as the coordinator does (go doc ./internal/demo)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *agree {
		if !(*smoothing > 0 && *smoothing <= 1) {
			return fmt.Errorf("-smoothing %v, want (0, 1]", *smoothing)
		}
		return runAgree(ctx, *scenario, *seed, *smoothing, *rebalance, *leaseTTL, *embedded, stdout)
	}
	if *scenario != "" {
		return errors.New("-scenario needs -agree")
	}
	cfg := demo.Config{Duration: *duration, Serve: *serve, Out: stdout, Embedded: *embedded,
		RebalanceInterval: *rebalance, LeaseTTL: *leaseTTL, Chart: *chart}
	if *plain {
		f := false
		cfg.Terminal = &f
	}
	_, err := demo.Run(ctx, cfg)
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stdout, "interrupted: everything the demo started is stopped")
		return nil
	}
	return err
}

// maxAgreeDuration bounds a live replay.
const maxAgreeDuration = 60 * time.Second

func runAgree(ctx context.Context, name string, seed uint64, smoothing float64, rebalance, leaseTTL time.Duration, embedded bool, stdout io.Writer) error {
	var sc *sim.Scenario
	var err error
	if name == "" {
		sc, err = demo.AgreementScenario()
	} else {
		sc, err = sim.LoadScenario(name)
	}
	if err != nil {
		return err
	}
	if d := time.Duration(sc.Duration); d > maxAgreeDuration {
		return fmt.Errorf("scenario %s lasts %v: a live replay is limited to %v", sc.Name, d, maxAgreeDuration)
	}
	fmt.Fprintf(stdout, "scenario %s, seed %d: simulating, then replaying its exact request stream live (rebalance every %v)\n", sc.Name, seed, rebalance)
	a, err := demo.Agree(ctx, demo.AgreeConfig{Scenario: sc, Seed: seed, Smoothing: smoothing, RebalanceInterval: rebalance, LeaseTTL: leaseTTL,
		Embedded: embedded, Log: stdout})
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stdout, "interrupted: everything the demo started is stopped")
		return nil
	}
	if err != nil {
		return err
	}
	a.WriteTable(stdout, demo.AgreementTolerance)
	if err := a.Faithful(); err != nil {
		return fmt.Errorf("the live run did not play the scenario faithfully: %w", err)
	}
	if d := a.Compare(demo.AgreementTolerance); len(d) > 0 {
		return fmt.Errorf("simulator and live run disagree: %v", d)
	}
	fmt.Fprintln(stdout, "simulator and live run agree within 10% (or 0.01 absolute)")
	return nil
}
