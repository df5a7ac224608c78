// Package sim is a deterministic discrete-event simulator of the quota
// system: it tells an operator, before they choose a rebalance interval,
// report interval, algorithm, overcommit ε or publish protocol, how far the
// regions together can overshoot a policy's global budget and how much
// legitimate traffic they deny.
//
// # Model
//
// Time is virtual: a loop over ticks (Scenario.Tick, default 100 ms) and a
// heap of control-plane events (reports, report arrivals, rebalances, epoch
// applications, acknowledgements, failures), ordered by time and then by
// insertion. Randomness comes from two math/rand/v2 PCGs seeded by
// Config.Seed: one draws the arrivals, the other the control plane
// (message delays, lost and late reports). Nothing reads the wall clock or
// touches the network, and a run starts no goroutine, so a Config always
// gives the same Result.
//
// Arrivals (Arrivals exports them): per tick, region and group, a Poisson
// count with mean rate·r·subjects·weight(region, t)·tick, each arrival
// assigned to a subject uniformly or by a Zipf law (Poisson splitting keeps
// every subject's stream Poisson). A subject's arrivals in one tick arrive
// together at the tick's start; they are decided exactly as that many unit
// requests one after the other, with one bucket.TokenState TakeUnitsAt
// (held by a test to n State.TakeAt of cost 1). BucketCalls counts the
// decisions a Store would be asked for the same batches: one per chunk of
// at most C until one is denied, then one for ⌊remaining⌋. The stream
// depends on the scenario, seed, regions, subjects and duration only, not
// on the rebalance interval, protocol or any decision; clients that ignore
// Retry-After (Group.Retries) add their retries on top.
//
// The system: each region holds one bucket.TokenState per subject (24
// bytes; the token bucket decisions of bucket.State and bucket.Memory, with
// the limits validated once by bucket.Prepare) and enforces the share of the latest allocation it
// applied (the policy default, or a per-subject override for the most
// pressured subjects, at most MaxOverrides). Regions report offered demand
// every ReportInterval (reports may be lost or late); the coordinator
// smooths it (allocator.Smooth), calls allocator.Split each
// RebalanceInterval and publishes with TwoStep (min(old,new), then the new
// shares once every live region acknowledged) or Naive (new shares at
// once). Every message takes PropagationDelay·U[0.5,1.5). A region that
// goes down serves nothing and its traffic moves to the live regions; it
// returns at its safe share. The coordinator counts a down region as
// holding its share until LeaseTTL+SkewMargin after it went down.
//
// Baselines decide the very same stream: an ideal global bucket per
// subject, independent full-budget buckets per region, and a static equal
// split. As they do not depend on the control plane, Sweep decides them
// once per stream, in a pass that also records the stream, and the runs of
// a sweep share them and replay the recording. A retrying group's subjects
// are decided in each run (their stream holds the system's denials) and
// merged with the shared subjects: buckets and windows are per subject, so
// admitted counts add up and window maxima take the larger.
//
// # Speed
//
// The default sweep (7 scenarios × 5 rebalance intervals × 2 protocols,
// one simulated hour, 3 regions, 10,000 subjects: 279 million requests)
// takes about 35 s of one core; BenchmarkSweep reports simulated requests
// per second (and per CPU-second). A decision touches the subject's region
// record (bucket, override share, report counters: 56 bytes) and its
// window counters (24 bytes). Report counters reset lazily, when a new
// interval first touches them.
//
// # Figures
//
// overshoot(W) = max over subjects and closed windows [t−W, t] of
// admitted/(C + r·W) − 1, floored at 0, for W = 1, 10 and 60 s;
// under-admission = 1 − admitted/admitted by the ideal bucket; convergence
// after each scenario shift; per-region admitted rate series; and
// MaxShareSum, the largest Σ of shares regions enforced at one instant.
// Measure, UnderAdmission and IdealBucket compute the same figures, with
// the same code, for a stream measured elsewhere (a live run replaying
// Arrivals).
//
// # Concurrency and zero values
//
// Run is safe for concurrent use with different Configs; an engine is used
// by one goroutine. Sweep runs independent Configs on up to GOMAXPROCS
// goroutines and waits for them. The zero Config is invalid (it needs a
// Scenario); every other zero field takes the default its doc states.
package sim
