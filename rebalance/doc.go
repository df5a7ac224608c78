// Package rebalance is the coordinator's loop: one elected leader moves
// each policy's shares between regions toward demand, through etcd only,
// without ever letting the shares a region may be enforcing sum above
// 1 + ε. docs/rebalance.md tells the whole protocol and its failover; this
// comment is the summary.
//
// # Rounds
//
// Every Config.Interval the leader takes, at one etcd revision, the live
// node registrations, their demand reports and acknowledgements, the
// operator controls, the policy documents and the published allocations.
// It reads them once when it starts leading and keeps them from then on
// from one watch of the deployment's prefix, each record decoded once
// and each region's demand summed again only for the policies whose
// demand changed (mirror); a round first applies what the watch
// delivered up to etcd's revision at the round's start, so it plans on
// what a read then would return without reading it. The leader reads
// everything again on the Config.FullEvery-th full round, when the watch
// is compacted, and while records over the bounds are left out. It smooths demand (allocator.Smooth), computes per policy the default
// split and the splits of at most Config.MaxOverrides pressured subjects
// (allocator.Split) and publishes what changed. A region's first smoothed
// demand is its first report, taken as it is. A region that registers
// again after the leader saw it without any node (a region back from an
// outage) gets a full round as soon as it writes its first demand report,
// rather than at the next tick. A full round that finds a policy's shrink
// still waiting for acknowledgements plans nothing for it; the round that
// then publishes the growth is followed by a full round at once, so that
// demand read meanwhile does not wait a whole Interval either. These
// rules are package plan's (plan.Leader), the same code the simulator and
// the operator's dry run use; Loop turns an etcd snapshot into a plan.View
// and does the I/O around it.
//
// A full round plans only the policies whose inputs changed since the
// last full round: their demand or acknowledgements (told by the watch,
// against the records kept), their operator controls, definition or
// allocation; plus those the planner is not done with (smoothed demand
// still moving, plan.Leader.Settled; a pending shrink or a live region
// without a share, plan.Idle). A change of registrations or retired
// regions, a new leader, RebalanceNow and a region back from an outage
// plan every policy, as does every Config.FullEvery-th full round, a
// safety net for anything the changes missed. The others are left as
// they are: on unchanged inputs the planner would publish nothing for
// them.
//
// # Two-step publish
//
// When any share (default or override) shrinks, the leader first publishes
// epoch e+1 with phase "shrink": every share is min(old, new) and Target
// holds new. Only when every region of the allocation has acknowledged
// e+1, or has lost its registration lease and SkewMargin has passed since
// the leader saw it gone (it then holds its Safe share, its minimum), does
// the leader publish e+2 = Target with phase "stable".
//
// # Regions of several nodes
//
// Each node of a region registers, reports and acknowledges under its own
// keys (etcdlayout.Node, DemandShard, AckShard; a node's shards are merged
// when read, and a record in the older one-per-node format is refused with
// an error in the log; demand records of the 256-record layout before are
// still read, a node with records in both layouts counted once,
// etcdlayout.DemandIn). A region is live while any
// node is registered and its demand is the sum of its nodes' reports. It
// has acknowledged an epoch when every registered node has and no node of
// it vanished less than SkewMargin ago; a new leader, which cannot know
// the nodes that vanished before it led, holds growth for SkewMargin after
// taking over. A node that vanished before acknowledging keeps its region
// from acknowledging later epochs until it registers again; the leader
// keeps such nodes under etcdlayout.Layout.BehindPrefix, fenced, before
// publishing, and a new leader reads them back. Acknowledgements
// and registrations are watched, so the growth follows the last
// acknowledgement at once; the changes already delivered when a round
// starts are read by that one round. Pure growth is published in one step. The naive
// protocol (ProtocolNaive) publishes new shares in one step, for
// comparison only.
//
// # Fencing and failover
//
// Leadership is a concurrency.Election on Layout.Election(). Every write of
// the leader is a transaction that also requires the election key's create
// revision to be the one it won with, and the allocation's mod revision to
// be the one it read, so a deposed leader cannot publish. Everything a new
// leader needs (epochs, phase, targets, pins, freezes) is in etcd; smoothed
// demand restarts from the latest reports, so there is no learning period,
// and a pending shrink is finished by whoever leads next.
//
// # Units, concurrency, zero values
//
// Shares and demand are fractions of a policy's global budget and rate.
// Loop is safe for concurrent use: Run owns every write in one goroutine;
// RebalanceNow hands a round to it; DryRun only reads. The zero Loop is
// not usable; build one with New.
package rebalance
