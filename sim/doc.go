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
// The system: each region holds one bucket.TokenState per subject (32
// bytes; the token bucket decisions of bucket.State and bucket.Memory, with
// the limits validated once by bucket.Prepare) and enforces the share of
// the latest allocation it applied (the policy default, or a per-subject
// override for the most pressured subjects, at most MaxOverrides). Every
// message takes PropagationDelay·U[0.5,1.5). A region that goes down
// serves nothing and its traffic moves to the live regions; it returns at
// its safe share (MinShare) and applies the latest epoch.
//
// # The control plane
//
// The coordinator is package plan, the same code as rebalance.Loop runs:
// each round the simulator hands a plan.Leader a plan.View (the registered
// nodes with their acknowledgements, each registered region's latest
// report) and publishes the plan.Decision. Only the driving is the
// simulator's: full rounds every RebalanceInterval, other rounds on every
// acknowledgement, registration change (a node registering, a lease
// ending) and recheck while growth waits on a skew margin (every
// min(RebalanceInterval, max(SkewMargin/4, 50 ms)), as the loop does), a
// full round at once when plan.Leader.ReportArrived or Settle asks for
// one. A returning coordinator is a new plan.Leader. A dry run's proposal
// (PredictOvershoot) is published as an operator's pin of every region.
//
// The regions follow internal/demand and internal/regional:
//
//   - Pressure. A request is pressured when its bucket denied it or it left
//     the bucket below half the local capacity f·C (the regional node's
//     Remaining < Limit/2); remaining tokens are read as whole tokens, so
//     at most one request of a batch can be counted differently.
//   - Reports. Every ReportInterval a region reports its offered rate
//     (denied requests included) and its pressured subjects with their
//     pressured offered rate, most pressured first, at most MaxOverrides.
//     Counts are exact (the node's Space-Saving summary is exact while a
//     shard holds fewer subjects than its top K). A report may be lost
//     (LostReports) or one interval late (LateReports); etcd keeps the
//     latest one, gone with the node's lease.
//   - Nodes. A region runs one node at a time. One that goes down keeps its
//     registration until its lease ends (LeaseTTL). One that comes back is
//     a new node: it registers, holds its safe share (MinShare) until it
//     applies the latest epoch, acknowledges afresh, and sends its first
//     report once it has served a whole interval.
//   - First allocation. A run starts with an allocation in force
//     (InitialShares, else an equal split of 1 + ε) at epoch 0 that every
//     region holds, like a deployment whose coordinator has published
//     before.
//
// Window algorithms: a scenario may give its policy a fixed window,
// sliding window counter or sliding log (Scenario.Algorithm and Window;
// C per window, r = C/Window). Their buckets are bucket.State, decided
// unit by unit, and a region charges a window's count at the lowest share
// it held during the longest time the count can span (a whole window, two
// for the sliding window counter: bucket.Limits.CountedFor), as a
// regional node does. Their figure is OvershootWindow, the largest count
// of one aligned window over C; the 1 s, 10 s and 60 s figures compare
// with C for every window the interval touches.
//
// New buckets: a token bucket a region creates (the subject's first
// request there, or one after its bucket idled past the TTL) starts with
// the lowest share the region held for the subject over the last full
// refill time C/r, not full at the current share
// (bucket.Prepared.TokenLimitsWithheld, as a regional node passes
// bucket.Request.Withheld from regionsync's LowestShare): a subject that
// spent its budget in one region and moves to another whose share grew
// meanwhile finds no fresh tokens there (scenario tenant-move). The
// region's share history is the allocations it applied; a region that
// comes back adds the safe share it holds until it applies the latest
// epoch.
//
// Lazy refill: a bucket refills the time since its last write at the rate
// of the share in force when it is next read; a share that grew refills
// the time before the growth at the old share (bucket.TokenState), as the
// stores do.
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
// BenchmarkSweep reports simulated requests per second and per CPU-second
// (docs/performance.md has the figures and the command). A decision touches the subject's region
// record (bucket, override share, pressure counter, last decision, a floor
// of its tokens: 64 bytes) and its window counters (24 bytes). Report
// counters reset lazily, when a new interval first presses them. Reading
// the tokens left after a fully admitted batch, for the pressure rule,
// takes one more bucket decision on a copy; it is skipped when the bucket
// was left alone for C/r at a share that did not grow since its last write
// (so it was full: ⌊f·C⌋ − n left) or its floor
// shows at least half left, with identical results (a test holds them to
// probing every batch).
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
// # Admitted decisions
//
// Config.Admitted, when set, receives every batch the system admitted
// (region, subject, instant, count) in time order: the stream
// internal/boundcheck checks as it checks a live run's decisions, so a
// run that overshoots here is one that checker shows, window by window.
// It is off by default and in sweeps.
//
// # Concurrency and zero values
//
// Run is safe for concurrent use with different Configs; an engine is used
// by one goroutine. Sweep runs independent Configs on up to GOMAXPROCS
// goroutines and waits for them. The zero Config is invalid (it needs a
// Scenario); every other zero field takes the default its doc states.
//
// # Leases
//
// RunLeases and SweepLeases model one level down: a region's bucket handed
// to consumers (Envoys over RLQS) as leases through bucket.Memory.LeaseAt,
// so that an operator can choose the lease TTL, reporting interval and
// consumers per node from the predicted overshoot (which must be 0) and
// under-admission (lease.go has the model; docs/rlqs.md the figures).
package sim
