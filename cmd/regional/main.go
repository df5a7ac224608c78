// Command regional runs one regional admission node; see
// internal/regional for the flags (also QUOTA_* environment variables).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/quotacoord/quota/internal/regional"
)

// gcPercent is the node's GOGC unless the environment sets one: a check
// allocates a few kilobytes that die with it, and the node's live heap is
// small, so collecting at 100% growth spent about a tenth of the node's CPU
// on the collector (pprof under bench-regional.sh); 400 cuts that to about
// a quarter for a few more megabytes of heap.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := regional.Main(ctx, os.Args[1:], os.Environ(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
