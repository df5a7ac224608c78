// Command quotacheck sends admission checks to a regional node and prints
// the decisions, for trying a policy out without grpcurl:
//
//	go run ./cmd/quotacheck -addr 127.0.0.1:8081 -subject tenant-a -policy exports -n 5
//	go run ./cmd/quotacheck -subject tenant-a -policy exports,daily -cost 3 -json
//	go run ./cmd/quotacheck -subject tenant-a -policy exports -cost 3 -refund
//
// -refund gives the cost back instead of checking; the node must grant the
// caller the refund action (its -grants file).
//
// Human output has one line per check and a summary; -json prints one JSON
// object per check, one per line. The exit status is 0 when every check was
// answered (allowed or denied), 1 on an error, 2 on bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "quotacheck:", err)
		}
		if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
