// Package demand records, on a regional node's hot path, how much cost each
// policy was offered and admitted and which subjects were under pressure,
// and turns that into the per-interval rates of an etcdlayout.DemandReport.
//
// # Units
//
// Cost is the caller's unit (requests, bytes, tokens), an int64 per record.
// Snapshot returns rates: cost per second over the interval between the
// previous snapshot (or the recorder's creation) and now.
//
// # What is recorded
//
// Every Record adds its cost to the policy's offered cost, and to its
// admitted cost when admitted (denied cost counts as offered). A pressured
// record (the bucket denied, or fell below half its local capacity) also
// feeds the policy's Space-Saving summary of pressured subjects: at most
// TopK subjects per shard, each with an upper bound of its pressured
// offered cost; Snapshot merges the shards and reports the TopK largest,
// most pressured first. A subject's Offered and Admitted in a report cover
// its pressured records only, which for a subject near its limit is nearly
// all of them.
//
// # Bounds
//
// Every counter (policy totals, a subject's pressured count, their sums in
// a snapshot) saturates at math.MaxInt64 instead of wrapping, so no run of
// large costs turns demand negative. Capping what one request may add
// (at most the policy's capacity) is the caller's part: see
// regional.Node, which records min(cost, capacity).
//
// Memory is bounded: at most MaxPolicies policies are tracked (records of
// further policies are dropped and counted by Dropped), and each policy
// holds Shards·TopK subject counters. When the table is full, a new policy
// evicts those without records over the last two snapshots; otherwise its
// records are dropped. Subjects longer than
// MaxSubjectLen bytes are counted in the policy totals but never kept.
//
// # Concurrency
//
// A Recorder is safe for concurrent use. Record takes no global lock: the
// policy table is an immutable map behind an atomic pointer, the totals are
// atomics, and only a pressured record takes the lock of one of the
// policy's subject shards. A policy first seen goes into a small table of
// fresh policies under the Recorder's lock, which records of it take until
// the next snapshot, or until a quarter as many fresh policies as known
// ones gather, when both tables are copied into a new immutable one:
// learning P policies copies O(P) entries in all, not the table per policy
// (O(P²), seconds of CPU at 10,000 policies).
// Record does not allocate once its policy is known. Snapshot may run
// concurrently with Record; a record that races a snapshot lands in this
// interval or the next, never in none (a record that races the eviction of
// its idle policy and stalls across two whole snapshots is the one
// exception). Record keeps references to at most Shards·TopK subject
// strings per policy.
//
// # Zero value
//
// The zero Recorder is not usable; build one with New.
package demand
