// Package daemon is the process shape the project's two daemons share,
// the regional node (cmd/regional) and the coordinator (cmd/coordinator),
// so that both read their settings, log and stop the same way:
//
//   - Settings: command-line flags; QUOTA_<FLAG> environment variables
//     (upper case, dashes as underscores) set a flag's default, and a flag
//     given on the command line wins (Parse). -h prints the usage and
//     exits 0, a bad flag or variable exits 2 naming it, any other error
//     exits 1 (Exec, Main).
//   - Logging: one hclog logger on stderr, its level from -log-level
//     (ParseLevel, the one parser of level names) and JSON lines with
//     -json-logs (LogFlags).
//   - Lists: comma-separated flag values such as etcd endpoints
//     (SplitList).
//   - Serving: a gRPC server with gRPC health checking and an HTTP server,
//     each on its own listener, stopped gracefully when the context ends:
//     health reports NOT_SERVING (and the daemon's readiness turns off),
//     both keep serving for a drain period (-drain) so that proxies move
//     away first, then gRPC lets calls in flight finish and
//     HTTP lets requests finish, each within a shutdown timeout after
//     which connections are closed (Serve). Cleanup undoes what a start
//     built, newest first.
//   - Runtime: StayAwake, called first in a latency-bound daemon's main,
//     re-executes it once with GODEBUG's schedtrace set (AwakeEnv), which
//     keeps the Go runtime's monitor thread from parking and being woken
//     again on every request that finds the process idle.
//
// Nothing here holds global state; every function but StayAwake (which
// replaces the process) is safe to call from several goroutines and
// several daemons in one process (tests do).
package daemon
