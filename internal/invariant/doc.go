// Package invariant checks the budget invariant of the rebalance protocol
// against what actually happened in etcd: it replays the history of the
// allocations (alloc/), acknowledgements (acks/) and registrations
// (regions/) revision by revision and, at every revision, bounds what each
// region may be enforcing.
//
// # What is checked
//
// For every policy, every subject (each subject with an override in the
// window, and the default for all others) and every etcd revision:
//
//	Σ_R  max over nodes N of R of
//	     max{ share_e(subject, R) : e from N's floor epoch to the latest } ≤ 1 + ε + Tolerance
//
// A region runs one or more nodes (regions/{region}/{node}, acks/{region}/
// {node}). They
// share the region's buckets, so a region may enforce the largest share
// any of its nodes may enforce: from the oldest epoch any of them may
// still hold. N's floor epoch is the epoch N last acknowledged for the
// policy; before its first acknowledgement under a registration, it is
// the latest epoch published when N registered (nodes register before
// they read alloc/). A node whose registration is gone (lease expired or
// revoked) counts at its safe share, the largest Safe[R] of the epochs
// from its floor on (its acknowledgement's key outlives the lease until a
// leader deletes it, and the floor stays after that: the node still
// applied the epoch it acknowledged); a node that never registered
// enforces nothing. A
// node whose floor is before the policy's first epoch counts at least at
// the policy's minimum share for its region (from the policy documents
// under policies/, replayed too): it enforces that until it applies an
// allocation. ε is the largest
// overcommit of the epochs in the window.
//
// The check works on revisions, not on wall time: it does not prove that
// the coordinator waited the clock-skew margin (the rebalance tests do).
//
// # Use
//
// History is the pure state machine (Put and Delete events, then Check);
// Replay feeds it the whole history of a live etcd through a watch from
// revision 1, so it needs an uncompacted etcd (every test etcd is).
// History is not safe for concurrent use; Replay is. The zero History is
// not usable: call NewHistory. Memory is bounded by the epochs in the
// window of the slowest node, at most MaxEpochs per policy, and by
// MaxDeadNodes nodes without registration (beyond it they fold into a
// per-region maximum, which can only make the check stricter).
package invariant
