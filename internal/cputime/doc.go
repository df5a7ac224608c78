// Package cputime reads the CPU time the process has used, for benchmarks
// that report work per CPU-second: on a shared machine other processes
// inflate wall time but not the benchmark's own CPU time.
//
// Process returns user plus system time of every thread; 0 means it is not
// measured on this platform (non-Unix), and callers then report wall time
// only. Safe for concurrent use.
package cputime
