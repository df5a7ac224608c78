package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/quotacoord/quota/internal/demo"
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
	rebalance := fs.Duration("rebalance-interval", time.Second, "the coordinator's rebalance interval")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := demo.Config{Duration: *duration, Serve: *serve, Out: stdout, Embedded: *embedded, RebalanceInterval: *rebalance}
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
