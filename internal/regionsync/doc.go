// Package regionsync connects one admission node of a region to etcd: it
// holds the node's lease, follows the published allocations and answers
// the hot path's share lookups, acknowledges the epochs it applied, writes
// demand reports, and hands policy documents to the server.
//
// # Shares
//
// Share(policy, subject) is the fraction f of the policy's global budget the
// region enforces for subject, in [0, 1+ε]: the subject's override for this
// region when the allocation has one, else the allocation's default share
// for this region. Lookups read an immutable table through an atomic
// pointer: no lock, no allocation.
//
// # The safety invariant
//
// Σ over regions of the shares being enforced ≤ 1 + ε. The coordinator keeps
// it for the published shares (two-step publish, minimums reserved); this
// package keeps it for a region cut off from etcd:
//
//   - Before the region holds a lease and has read the allocations under it,
//     every share is the safe share: Allocation.Safe[region] when an
//     allocation exists, else the minimum the policy names explicitly for
//     the region (Config.MinShare; 0 when none). A node configured with
//     etcd never starts at share 1, and a region left out of an allocation
//     enforces no more than its explicit minimum.
//   - Every lease keepalive that succeeds moves "last good" to the instant
//     the keepalive was sent, on Config.Clock's monotonic reading (a wall
//     clock stepped back does not make the lease look younger). When that
//     reading is more than LeaseTTL (less one loss check, at most 100 ms)
//     past it, every share becomes the safe share at once, without waiting
//     for etcd to say anything. Measuring from the send instant means the
//     region gives up its shares no later than etcd expires the lease, so
//     the coordinator (which waits for the expiry plus a skew margin, the
//     margin covering clock rate skew only) never hands them to another
//     region while this one still enforces them. The lease's age is
//     checked by a ticker and by every check (Share, Begin): a process that
//     was paused past the TTL switches to the safe shares, synchronously,
//     before its first check after waking reads a share, and drops the
//     lease it can no longer trust.
//   - When Run returns (a graceful stop), every share becomes the safe
//     share and then the lease is revoked, so the coordinator can hand the
//     region's shares to others without waiting for the TTL.
//   - A region that lost its lease goes back to the published shares only
//     after it was granted a new lease, registered under it, and read every
//     allocation afresh. A keepalive or a leased write answered "lease not
//     found" counts as a loss too.
//   - An allocation that does not parse or holds an impossible share is
//     enforced at the safe share and its epoch is not acknowledged.
//   - An epoch is acknowledged only once every check uses it: after the
//     table holding it was published (so every check that starts later
//     reads it) and after every check that pinned an older table with
//     Begin called End (so none still takes tokens at a share the region
//     gave up). A caller that reads shares with Share instead of Begin
//     gets only the first half: a check in flight at the switch may finish
//     at the old share.
//
// Timers (keepalive pacing, the loss check, report intervals, back-off)
// run on real time; what they measure is read from Config.Clock: the
// lease's age from its monotonic reading, report and ack timestamps from
// its wall reading.
//
// # Keys
//
// Everything follows internal/etcdlayout. A Syncer is one node of its
// region (Config.Node, by default the hostname plus a random suffix) and
// writes regions/{region}/{node} (Registration) and demand/{region}/{node}/{shard}
// (DemandReport) under its own lease, and acks/{region}/{node}/{shard}
// (Ack) without it but only while its registration is held under it
// (Owner): an acknowledgement outlives the lease, so that a leader that
// did not see the node go still learns which safe shares it may enforce
// cut off. A new registration deletes the node's earlier ones. The nodes
// of one region never overwrite each other, and one stopping
// (its lease revoked) leaves the region registered through the others. The
// coordinator treats the region as live while any node is registered,
// sums their demand and grows only after every node acknowledged;
// alloc/, policies/ and settings are watched (get, then watch from the
// next revision; a compacted or failed watch starts over with a get).
//
// Demand reports are split by policy into etcdlayout.DemandShards records
// and acknowledgements into etcdlayout.Shards (ShardWriter): demand is
// split finer because a demand record is rewritten whenever one of its
// policies' demand moves, so a moving policy costs about one small record
// however many policies the node holds. After each publish the ack loop
// rewrites only the shards whose epochs changed, after each report
// interval the reporter only the shards whose demand moved past
// DemandTolerance, in transactions within etcd's limits. An
// acknowledgement shard is written, like the whole record was, only once
// checks no longer use older shares, so every epoch in it is enforced.
//
// # Share history
//
// LowestShare(policy, subject, within) is the lowest share the region
// enforced for subject during the last within (on the monotonic clock):
// the current share, every version of the policy's allocation applied in
// that time, and the safe share for a period without a lease. The node
// fills a token bucket it creates (absent, or idle-expired) only to that
// share over the bucket's full refill time (bucket.Request.Withheld), so
// a share that grew hands no fresh tokens to a subject that spent its
// budget in the region the share came from. History starts at the node's
// first read (a node that starts knows nothing older) and at a policy's
// first allocation (before it every region held only its minimum); at
// most 16 versions per policy are kept, the oldest merged into one that
// counts every subject at the lowest share any subject had.
//
// # Nodes of a region
//
// Nodes is the number of nodes registered under regions/{region}/ as last
// read (get, then watch), this node counted whether or not its own
// registration is there, 1 before the first read. A node that decides
// without the region's Redis (failure mode local) divides its share by it.
// A node that joins is counted by the others once its registration reaches
// them through their watch; one whose lease ended, once etcd deletes it.
//
// DemandPart is this node's part of its region's demand for a policy and
// subject, from the demand reports of the region's nodes under
// demand/{region}/ (get, then watch; the records the coordinator reads):
// node leases and RLQS assignments split a region's bucket among its
// nodes by it.
//
// # Concurrency and goroutines
//
// Run starts every goroutine of a Syncer and returns only after all of them
// ended; it may be called once. Share, Begin (and the Pin's Share and End),
// Ready, Lost, Epoch, LowestShare, Nodes, DemandPart and Flush are
// safe for concurrent use, before, during and after Run. The zero Syncer is
// not usable; build one with New.
//
// # Units
//
// Shares are fractions. LeaseTTL is rounded up to whole seconds (etcd
// grants leases in seconds); left zero, each lease takes the TTL the
// coordinator publishes in settings (rebalance's RegionLeaseTTL), read
// before the grant, so one flag on the coordinator sets every region's
// TTL. A changed setting applies from the next lease on. Demand reports carry cost per second.
package regionsync
