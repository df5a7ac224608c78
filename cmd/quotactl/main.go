// Command quotactl is the operator CLI of the quota coordinator: policies,
// allocations, rebalancing, freezes, pins, weights, minimums and the audit
// log, over the coordinator's operator gRPC API.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "quotactl:", err)
		os.Exit(1)
	}
}
