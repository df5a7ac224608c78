// Package demo runs the quota system end to end on loopback and plays a
// story against it: the real coordinator (package internal/coordinator:
// embedded etcd, the rebalance loop, the operator API quotactl talks to),
// one regional node per region (regional.Main in this process, each on its
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
// What was found on the hot-tenant-hop scenario (seed 1, rebalance 1 s,
// reports 500 ms, α 0.5, max step 0.3): the simulator predicts
// under-admission 0.139 (0.139 to 0.150 over seeds 1 to 4); live runs on
// a shared 2-core machine measured 0.137 to 0.156, higher the more loaded
// the machine was (late requests, slower etcd round trips); overshoot was
// 0 on both sides. The simulator's control plane still differs from
// package rebalance and package demand in three ways, which move its
// prediction in opposite directions and largely cancel on this scenario:
//
//  1. It smooths demand at every report arrival; the live coordinator
//     smooths once per round over the latest report of each region and
//     takes a first observation unsmoothed. Alone: 0.139 → 0.170.
//  2. A simulated region reports every subject it holds an override for,
//     pressured or not; a live region reports only pressured subjects, so
//     the region a hot tenant left falls to its minimum faster. With 1:
//     0.148 (seeds 1 to 4: 0.138 to 0.153).
//  3. A live subject is pressured when its bucket denied or fell below
//     half its local capacity (the simulator: denials only), and its
//     override lives OverrideRounds (3) rounds after the last pressure
//     (the simulator: until its smoothed demand is below 0.05). With 1
//     to 3: 0.153 (seeds 1 to 4: 0.142 to 0.154).
//
// These were measured with a modified copy of package sim; the changes
// belong in package sim. At α = 1 (no smoothing) the gaps vanish: the
// stock simulator and the modified one both predict 0.147 on average
// over seeds 1 to 4 (0.145 for seed 1), and nine live runs of seed 1
// measured 0.131 to 0.153 (mean 0.143, standard deviation 0.007: the
// report phases and round instants of a real deployment jitter).
// TestSimAgreesWithLive therefore runs at α = 1 until package sim models
// the coordinator's smoothing and reporting; with a spread of 0.007
// against an allowance of 0.0145 it can still fail about once in twenty
// runs by chance, and fails when a loaded machine cannot replay the
// stream on time (Agreement.Faithful). The report phase (live regions report at their
// own offsets, simulated ones all at multiples of the interval) moved the
// figure by less than 0.005 in the same experiment; Agreement.ReportPhases
// records it.
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
