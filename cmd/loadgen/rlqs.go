package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/quotacoord/quota/internal/loadgen"
)

// rlqsFlags are the flags of -rlqs mode: N Envoy-faithful RLQS clients.
type rlqsFlags struct {
	on       *bool
	cfg      loadgen.RLQSConfig
	nodePID  *int
	interval *time.Duration
}

func addRLQSFlags(fs *flag.FlagSet) *rlqsFlags {
	f := &rlqsFlags{
		on:       fs.Bool("rlqs", false, "drive the node's Rate Limit Quota Service with -streams Envoy-faithful clients instead"),
		nodePID:  fs.Int("node-pid", 0, "with -rlqs: the node's process id, to report usage reports per node CPU-second (/proc/PID/stat)"),
		interval: fs.Duration("report-interval", time.Second, "with -rlqs: each client's usage report interval"),
	}
	fs.IntVar(&f.cfg.Streams, "streams", 100, "with -rlqs: clients, one stream each")
	fs.IntVar(&f.cfg.Buckets, "buckets", 10, "with -rlqs: bucket ids per client ({KEY: b0..bN-1}, shared by every client)")
	fs.Float64Var(&f.cfg.Rate, "rate", 10, "with -rlqs: requests each client offers per bucket per second")
	return f
}

// runRLQS runs -rlqs mode with the shared flags' values.
func runRLQS(ctx context.Context, f *rlqsFlags, shared loadgen.Config, jsonOut bool, stdout io.Writer) error {
	cfg := f.cfg
	cfg.Addr, cfg.Domain, cfg.Key, cfg.Conns = shared.Addr, shared.Domain, shared.Key, shared.Conns
	cfg.Duration, cfg.Warmup, cfg.ReportInterval = shared.Duration, shared.Warmup, *f.interval
	if shared.Requests != 0 {
		return fmt.Errorf("loadgen: -n does not apply to -rlqs (use -duration)")
	}
	if *f.nodePID < 0 {
		return fmt.Errorf("loadgen: -node-pid %d", *f.nodePID)
	}
	if *f.nodePID > 0 {
		cfg.NodeCPU = loadgen.ProcessCPU(*f.nodePID)
		if _, err := cfg.NodeCPU(); err != nil {
			return fmt.Errorf("loadgen: -node-pid %d: %w", *f.nodePID, err)
		}
	}
	res, err := loadgen.RunRLQS(ctx, cfg)
	if err != nil {
		return err
	}
	if jsonOut {
		return json.NewEncoder(stdout).Encode(res)
	}
	return res.Print(stdout)
}
