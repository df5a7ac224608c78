// Package demo runs the quota system end to end on loopback and plays a
// story against it: the real coordinator (package internal/coordinator:
// embedded etcd, the rebalance loop, the operator API quotactl talks to),
// one regional node per region (regional.Run in this process, each on its
// own redis-server child process when one is installed, else the embedded
// store, each reaching etcd through a fault proxy so that a region can
// fail), and an open-loop load driver over the nodes' real gRPC API.
//
// Units: rates are requests (cost units) per second; time offsets are from
// the start of the story; shares are fractions of a policy's global budget.
//
// The measures are the simulator's, computed by package sim's own code
// (sim.Measure, sim.IdealBucket, sim.UnderAdmission): overshoot(W) = max
// over subjects and windows of length W of admitted / (C + r·W) − 1,
// floored at 0, and under-admission = 1 − admitted /
// admitted-by-an-ideal-global-bucket on the same merged stream. With the
// two-step protocol the regions together should never overshoot beyond ε
// (0 here) by more than measurement noise.
//
// # The failover
//
// A failing region's node is cut off from etcd (Deployment.CrashRegion):
// it keeps enforcing its share until its lease TTL runs out, then falls to
// its safe share; the coordinator hands the share to the others only once
// the lease expired plus the skew margin. The demo uses a 3 s lease and a
// 500 ms skew margin (production defaults: 10 s and 2 s) so that this is
// visible within a 30 s phase. A graceful stop (Deployment.StopRegion)
// revokes the lease at once instead.
//
// # Simulator against reality
//
// Agree runs one sim.Scenario both ways: sim.Run, and the same request
// stream (sim.Arrivals, same seed) replayed in real time by Replay against
// a Deployment with the same intervals, allocator parameters, smoothing,
// minimum share and lease timings, starting on a coordinator round so
// that rounds fall at the simulator's instants. Both admitted streams are
// measured alike. AgreementTolerance is 10% of the simulator's figure or
// 0.01 absolute, whichever is larger. A live run is only evidence if it
// played the stream faithfully (Agreement.Faithful).
//
// The agreement test (TestSimAgreesWithLive) plays the hot-tenant-hop
// scenario (seed 1, rebalance 1 s, reports 500 ms, α 0.5, max step 0.3).
// The simulator runs the coordinator's own planner (package plan) and the
// regions follow package demand's rules, so what is left to differ is the
// timing of a real deployment: report phases (live regions report at their
// own offsets, simulated ones at multiples of the interval;
// Agreement.ReportPhases records them) and round instants. A loaded
// machine that cannot replay the stream on time fails the test
// (Agreement.Faithful). docs/performance.md has the figures both sides
// measured.
//
// # Concurrency and zero values
//
// Everything Run, Deploy and Agree start they stop before returning (or in
// Deployment.Close): child processes by their PID, in-process nodes and the
// coordinator by cancelling them. Recorder is safe for concurrent use;
// Driver, Replay, View and Story are not meant to be shared (View.SetNote
// may be called while another goroutine shows). The zero Config runs the
// default 90 s story; the zero AgreeConfig is invalid (it needs a
// scenario).
package demo
