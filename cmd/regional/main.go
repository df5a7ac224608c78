// Command regional runs one regional admission node; see
// internal/regional for what it serves and `regional -h` for its flags.
// Settings, logging and shutdown follow internal/daemon, as for
// cmd/coordinator: QUOTA_<FLAG> environment variables set flag defaults (a
// flag wins), logs go to stderr (-log-level, -json-logs), SIGINT or SIGTERM
// stop it gracefully within -shutdown-timeout.
package main

import (
	"os"
	"runtime/debug"

	"github.com/quotacoord/quota/internal/daemon"
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
	daemon.Main("regional", regional.Main)
}
