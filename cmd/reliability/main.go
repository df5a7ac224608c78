// Command reliability turns the reliability suites' report into the table
// of `make reliability`:
//
//	reliability fuzz -report FILE -name NAME -log LOG -exit CODE
//	reliability table -report FILE
//
// fuzz appends one fuzz run (its executions read from the `go test -fuzz`
// output in LOG) to FILE; table prints FILE as a table and exits 1 unless
// every fault survived, no decision was lost, no invariant broke and no
// randomized live run admitted more than the cross-region bound.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
