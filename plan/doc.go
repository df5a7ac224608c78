// Package plan is the coordinator's round as a pure function: given what
// the regions reported and acknowledged, the allocation in force, the
// operator's controls and the planner's rules, it says what allocation to
// publish, what the growth waits for, and whether a full round is owed.
// rebalance.Loop runs it on a snapshot of etcd and publishes through its
// fenced transaction; the operator's dry run runs it on a copy of the
// leader's state; package sim runs it inside its discrete-event model.
// There is no second copy of these rules.
//
// # A round
//
// A Leader holds what a leading coordinator keeps between rounds (smoothed
// demand, when regions and nodes were last seen) and starts empty: a new
// leader needs no learning period. Each round the caller:
//
//  1. Track: records, from the View of registered nodes, which regions of
//     the allocations lost their last node (and since when), which came
//     back, and which nodes vanished.
//  2. Observe (full rounds only): smooths each live region's share of the
//     offered load with allocator.Smooth and Params.Alpha, taking a
//     region's first observation as it is and only from a report; smooths
//     each pressured subject's offered rate over the policy's rate,
//     forgetting a subject OverrideRounds rounds after its last report.
//  3. Plan, per policy: a pending shrink either grows (every node of every
//     region acknowledged it, or its region lost its lease a SkewMargin
//     ago, and the leader has led for a SkewMargin) or waits; otherwise a
//     full round splits the default and the most demanding pressured
//     subjects with allocator.Split and publishes what changed, as one
//     stable epoch when nothing shrinks (or under the Naive protocol) and
//     else as a shrink epoch of min(old, new) with the target attached.
//  4. Settle: reports whether the round that published a growth a full
//     round had to wait for must be followed by a full round at once.
//
// What a split counts: a live region is one with a registered node,
// unless one of its nodes reports another fingerprint (policies, subject
// naming) than most nodes (View.Mismatched); a retired region without a
// node is left out (View.Retired); every region is reserved at least the
// largest safe share it may still fall back to (Allocation.Held), until
// every node of it has acknowledged an epoch that no longer holds more:
// its registered nodes, and the nodes a leader saw lose their
// registration before acknowledging (cut off, they keep the safe share
// of the epoch they last applied) until they register again. The caller
// keeps those (Leader.Behind) where a new leader reads them back
// (View.Behind), so that failover does not forget them. A
// shrink epoch publishes min(old, new) safe shares (TargetSafe holds the
// new), and with Params.AckDeadline a node that has not acknowledged a
// shrink within the deadline (plus the skew margin) since the leader
// first saw it counts at its safe share, to which it fell back.
//
// A caller that plans only the policies whose inputs changed (package
// rebalance at scale) observes them with ObserveSome, and must also plan
// the policies not Settled (their smoothed demand still moves on the same
// reports) and those a round that is not full acts on (not Idle).
//
// ReportArrived tells a caller that watches demand reports that a region
// back from having no node just reported: a full round at once spares it
// an interval at its minimum.
//
// # Units and invariants
//
// Shares and demand are fractions of a policy's global budget and rate.
// Every allocation Plan publishes has Σ shares ≤ 1 + ε (within
// allocator.Tolerance) for the default and every override; a region
// enforcing either of two consecutive epochs of a shrink-then-grow stays
// within that bound because each region's share only shrinks until every
// region acknowledged the shrink.
//
// # Concurrency and time
//
// Nothing here reads a clock, etcd or the network; every method takes the
// instant it runs at. A Leader is not safe for concurrent use. Published
// allocations are treated as immutable: Plan may share maps between the
// allocation in force and the one it returns.
package plan
