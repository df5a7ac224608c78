// Command scale runs the control plane at a given size (package
// internal/scale): the real coordinator on its embedded etcd and many
// regional nodes speaking the real protocol in one process, without
// Redis. It prints one markdown table row per run; -header prints the
// table's header first. With -node it measures one regional node's
// memory instead: -policies policies and -subjects live subjects on the
// in-process store.
//
//	scale -policies 1000 -regions 3 -nodes 10 -duration 30s
//	scale -policies 1000 -regions 3 -nodes 10 -duration 30s -failover
//	scale -node -policies 10000 -subjects 1000000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/scale"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var p scale.Params
	var header, verbose, node bool
	var subjects int
	var cpuProfile string
	fs.IntVar(&p.Policies, "policies", 100, "token-bucket policies")
	fs.IntVar(&p.Regions, "regions", 3, "regions")
	fs.IntVar(&p.NodesPerRegion, "nodes", 2, "nodes per region")
	fs.IntVar(&p.Moving, "moving", 0, "policies whose demand turns to the next region every three rebalance intervals (0: all); the others keep theirs")
	fs.Float64Var(&p.Jitter, "jitter", 0, "scale what each node records of each policy's offered rate by a random factor in [1-jitter, 1+jitter] (0 to 0.5): the noise of real reports")
	fs.IntVar(&p.Records, "records", 40, "times per report interval each node records its demand (a report's rates are steady to about 1/records)")
	fs.IntVar(&p.Pressured, "pressured", 4, "pressured subjects each node reports per policy")
	fs.DurationVar(&p.ReportInterval, "report-interval", time.Second, "demand report interval")
	fs.DurationVar(&p.RebalanceInterval, "rebalance-interval", time.Second, "rebalance interval")
	fs.DurationVar(&p.Duration, "duration", 20*time.Second, "how long to measure once every node is ready and warmed up")
	fs.DurationVar(&p.Warmup, "warmup", 0, "how long to wait once every node is ready before measuring (default ten rebalance intervals)")
	fs.StringVar(&p.DataDir, "data-dir", "", "embedded etcd data directory (default a new temporary directory, removed at the end)")
	fs.BoolVar(&header, "header", false, "print the table header first")
	fs.BoolVar(&verbose, "v", false, "log the coordinator's rounds to stderr")
	fs.DurationVar(&p.SessionTTL, "session-ttl", scale.DefaultSessionTTL, "the coordinators' election session TTL (1s to 1m): how long a leader cut off keeps the lead, and how late its keep-alives may be under load")
	fs.BoolVar(&p.Failover, "failover", false, "after measuring, cut the leader off from etcd and measure the standby's takeover (a second table)")
	fs.BoolVar(&node, "node", false, "measure one regional node's memory (with -policies and -subjects) instead of a deployment")
	fs.IntVar(&subjects, "subjects", 100000, "with -node: live subjects, checked once each")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write the whole run's CPU profile (go tool pprof) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if node {
		res, err := scale.NodeMemory(ctx, scale.NodeParams{Policies: p.Policies, Subjects: subjects})
		if err != nil {
			return err
		}
		if header {
			fmt.Fprintln(stdout, scale.NodeTableHeader)
		}
		fmt.Fprintln(stdout, scale.NodeTableRow(res, command(args)))
		return nil
	}
	if p.DataDir == "" {
		dir, err := os.MkdirTemp("", "quota-scale-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		p.DataDir = dir
	}
	if verbose {
		p.Logger = hclog.New(&hclog.LoggerOptions{Name: "coordinator", Output: stderr})
	}
	res, err := scale.Run(ctx, p, stderr)
	if err != nil {
		return err
	}
	if header {
		fmt.Fprintln(stdout, scale.TableHeader)
	}
	fmt.Fprintln(stdout, scale.TableRow(res, command(args)))
	if p.Failover {
		fmt.Fprintln(stdout)
		if header {
			fmt.Fprintln(stdout, scale.FailoverHeader)
		}
		fmt.Fprintln(stdout, scale.FailoverRow(res, command(args)))
	}
	return nil
}

// command is the command line that reproduces a row: args without the
// flags that only change the output.
func command(args []string) string {
	out := []string{"scale"}
	for i := 0; i < len(args); i++ {
		switch f := strings.TrimLeft(args[i], "-"); {
		case f == "cpuprofile":
			i++ // and its file
		case f != "header" && f != "v" && !strings.HasPrefix(f, "cpuprofile="):
			out = append(out, args[i])
		}
	}
	return strings.Join(out, " ")
}
