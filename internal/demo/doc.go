// Package demo runs the quota system end to end on loopback and plays a
// story against it: a coordinator (embedded etcd and the rebalance loop),
// one regional node per region (regional.Main in this process, each on its
// own redis-server child process when one is installed, else the embedded
// store), and an open-loop load driver over the nodes' real gRPC API.
//
// Units: rates are requests (cost units) per second; time offsets are from
// the start of the story; shares are fractions of a policy's global budget.
//
// The measures are the simulator's (package sim): overshoot(W) = max over
// windows of length W of admitted / (C + r·W) − 1, floored at 0, and
// under-admission = 1 − admitted / admitted-by-an-ideal-global-bucket on
// the same merged stream. With the two-step protocol the regions together
// should never overshoot beyond ε (0 here) by more than measurement noise.
//
// Everything Run starts it stops before returning: child processes by
// their PID, in-process nodes and the coordinator by cancelling them.
// Recorder is safe for concurrent use; Driver, View and Story are not
// meant to be shared. The zero Config runs the default 90 s story.
package demo
