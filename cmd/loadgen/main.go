// Command loadgen drives Envoy's rate limit service API with a closed loop
// of concurrent callers and prints decisions per second and latency
// quantiles; with -serve-noop it is instead a rate limit service that
// answers OK without any work, the ceiling to measure against (with
// -noop-redis, after one PING to Redis: the floor of a service that asks
// Redis once per check); with -rlqs
// it opens -streams Envoy-faithful Rate Limit Quota Service clients that
// decide locally and report usage, and prints the streams held and the
// usage reports per second (per node CPU-second with -node-pid).
//
//	loadgen -addr 127.0.0.1:8081 -c 50 -duration 10s -subjects 10000 -zipf 1.1
//	loadgen -serve-noop 127.0.0.1:9091
//	loadgen -serve-noop 127.0.0.1:9092 -noop-redis 127.0.0.1:6379
//	loadgen -rlqs -addr 127.0.0.1:8081 -streams 500 -buckets 20 -node-pid 4242
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/loadgen"
	"github.com/quotacoord/quota/internal/regional"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, asNode); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// asNode gives the process the node's runtime settings (cmd/regional):
// the monitor thread kept awake (a re-execution) and the node's GOGC.
func asNode(stderr io.Writer) {
	if err := daemon.StayAwake(); err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(regional.GCPercent)
	}
}

// run parses args and runs what they ask for. A no-work server first calls
// serverRuntime (main passes asNode, so that the ceiling and the node differ
// only in the work; tests, which must not re-execute, pass nil).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, serverRuntime func(io.Writer)) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadgen.Config
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:8081", "rate limit service address")
	fs.IntVar(&cfg.Concurrency, "c", 50, "concurrent callers")
	fs.Int64Var(&cfg.Requests, "n", 0, "stop after this many requests (0: use -duration)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (default 10s when -n is 0)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "load this long before measuring")
	fs.IntVar(&cfg.Subjects, "subjects", 10000, "distinct subjects")
	fs.Float64Var(&cfg.Zipf, "zipf", 0, "Zipf exponent s of the subject draw (0: uniform)")
	fs.IntVar(&cfg.Descriptors, "descriptors", 1, "descriptors per request (keys KEY0..KEYn-1 when more than one)")
	fs.StringVar(&cfg.Domain, "domain", "bench", "request domain")
	fs.StringVar(&cfg.Key, "key", "tenant", "descriptor entry key")
	var hits uint
	fs.UintVar(&hits, "hits", 0, "hits_addend of every request (0: unset)")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "per-request timeout (default 5s)")
	fs.IntVar(&cfg.Conns, "conns", 1, "gRPC connections shared by the callers")
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	noop := fs.String("serve-noop", "", "serve a no-work rate limit service on this address instead")
	noopRedis := fs.String("noop-redis", "", "with -serve-noop: send one PING to the Redis at this address before each answer")
	rq := addRLQSFlags(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("loadgen: unexpected arguments %q", fs.Args())
	}
	if *noop != "" {
		if serverRuntime != nil {
			serverRuntime(stderr)
		}
		l, err := net.Listen("tcp", *noop)
		if err != nil {
			return fmt.Errorf("loadgen: listen %s: %w", *noop, err)
		}
		if *noopRedis != "" {
			fmt.Fprintf(stdout, "no-work rate limit service with one Redis PING per check on %s\n", l.Addr())
			return loadgen.ServeRoundTrip(ctx, l, *noopRedis)
		}
		fmt.Fprintf(stdout, "no-work rate limit service on %s\n", l.Addr())
		return loadgen.ServeNoop(ctx, l)
	}
	if *noopRedis != "" {
		return fmt.Errorf("loadgen: -noop-redis needs -serve-noop")
	}
	if *rq.on {
		if cfg.Requests == 0 && cfg.Duration == 0 {
			cfg.Duration = 10e9
		}
		return runRLQS(ctx, rq, cfg, *jsonOut, stdout)
	}
	if cfg.Concurrency < 1 || cfg.Subjects < 1 || cfg.Descriptors < 1 || cfg.Conns < 1 {
		return fmt.Errorf("loadgen: -c, -subjects, -descriptors and -conns must be at least 1")
	}
	if hits > 1<<32-1 {
		return fmt.Errorf("loadgen: -hits %d does not fit 32 bits", hits)
	}
	cfg.HitsAddend = uint32(hits)
	if cfg.Requests == 0 && cfg.Duration == 0 {
		cfg.Duration = 10e9
	}
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		return enc.Encode(res)
	}
	return res.Print(stdout)
}
