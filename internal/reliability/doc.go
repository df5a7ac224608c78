// Package reliability holds the project's fault, load and security suites
// (as ordinary Go tests over real redis-server, embedded etcd and the
// project's own fault-injecting proxy, all on loopback) and the summary
// they report.
//
// # Suites
//
// The tests run a short, bounded configuration by default, so that CI runs
// them with `go test -race ./internal/reliability`; with RELIABILITY_LONG=1
// every phase lasts longer and the soak runs for minutes. With
// RELIABILITY_REPORT=FILE each test appends one JSON Entry per fault, soak
// or check to FILE; cmd/reliability turns those lines (and the output of
// `go test -fuzz` runs) into the summary table of `make reliability`.
//
// # Units
//
// Memory is in bytes (runtime heap in use after a GC; Redis used_memory),
// latencies are time.Duration, decisions and fuzz executions are counts.
//
// # Invariants checked
//
// No decision is lost (every check gets an answer, degraded or not); the
// decisions made during a fault follow each policy's failure mode; normal
// decisions come back by themselves; the budget invariant Σ shares ≤ 1 + ε
// holds over etcd's whole history (internal/invariant); admissions of a
// fail-closed policy stay within C + r·t.
//
// # Concurrency and zero values
//
// Recorder is safe for concurrent use; its zero value records nothing.
// Summary's zero value is an empty summary.
package reliability
