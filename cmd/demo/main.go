// Command demo runs the whole system on loopback and plays a story
// against it: a coordinator with embedded etcd, three regional nodes (each
// on its own redis-server when one is installed, else the embedded store),
// and a load driver with a live view and a final summary.
//
//	go run ./cmd/demo -duration 90s [-serve]
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
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
