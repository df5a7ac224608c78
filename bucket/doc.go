// Package bucket turns "capacity C, refill r per second, share f, cost w"
// into one atomic admission decision, in Redis (Redis) or in process
// (Memory). Memory is the specification: a differential test drives both
// through the same random sequences and demands equal decisions.
//
// A caller that indexes its buckets itself (the simulator) holds them as
// State values (the per-bucket code Memory runs) or, for token buckets,
// TokenState values: 32 bytes without pointers, deciding a batch of n unit
// requests at one instant exactly as n unit TakeAt calls of a State.
//
// # Units
//
// Capacity and costs are whole tokens; RefillPerSecond is tokens per
// second; Window and IdleTTL are durations (IdleTTL is rounded up to a
// millisecond). A region's bucket enforces capacity f·C and refill f·r,
// where f is Request.Share. Internally amounts are milli-tokens and time is
// microseconds: every stored number is an integer below 2^53, so Go float64
// and Lua doubles compute bit-identical results. Decision.Limit and
// Remaining are tokens (multiples of 0.001); RetryAfter and ResetAfter are
// rounded up to a microsecond.
//
// # Algorithms
//
//   - TokenBucket (default): a denial writes nothing; refill adds whole
//     milli-tokens and carries the remainder in the stored timestamp. When
//     the share shrinks, stored tokens are clamped to f·C and the clamp is
//     written (even by a peek or a denial), so a later growth cannot bring
//     them back. When it grows, no token is added at once: the time since
//     the last write refills at the old share, up to the old capacity (the
//     stored value records the capacity it was written at), the next call
//     writes the new capacity (even a peek or a denial), and refill runs at
//     the new f·r from then on. So the share in force at each instant bounds
//     what refills in it, and regions that hand share to each other admit
//     no more together than one bucket would. A cost above f·C is denied with RetryAfter = a full
//     refill at this share (the share must grow first). RefillPerSecond 0
//     means an allowance of f·C per IdleTTL after the last write. A bucket
//     a request creates (absent, or expired) starts full, or with
//     (f − Request.Withheld)·C when the request withholds part of the
//     share: a region whose share grew within the last full refill time
//     withholds the growth, so that a subject that spent its budget in
//     another region finds no fresh tokens here. A bucket that the store
//     may have lost starts lower still (Lost state and key versions).
//   - FixedWindow: Envoy's rate limit service windows (aligned to multiples
//     of Window since the Unix epoch); unlike Envoy a denied hit is not
//     counted, which gives the same decisions for unit costs.
//   - SlidingWindow: previous window's count weighted by its part still
//     inside the sliding window, plus the current count.
//   - SlidingLog: exact; one entry per admission, at most f·C entries
//     (C ≤ MaxSlidingLogCapacity, f ≤ 1+ε ≤ 2: at most 2000 entries, 11 bytes
//     each in Redis).
//
// # Lost state and key versions
//
// A store that loses its state (Redis restarted without persistence,
// FLUSHALL, a failover to a replica that never had the data; an in-process
// Memory whose process restarted) would read every bucket as absent, that
// is full, and hand a subject that had spent its budget a second one. So
// would a policy edit, which moves buckets to a new key version. Both are
// answered the same way: an absent bucket that may have been lost at an
// instant born reads, while born is younger than its refill time, as lost
// then: a token bucket as emptied at born (what refilled since, at most
// the request's fill; with no refill: empty until IdleTTL after born), a
// fixed or sliding window as a full count in born's window, a sliding log
// as one entry at born holding the whole capacity. A window W that
// contains born then admits no more than the bound allows, C + r·W (or N
// per window), whatever was spent before it. born is the later of:
//
//   - Request.Since, the instant the bucket's key version came into force
//     (a regional node passes when it loaded the edit);
//   - with RedisConfig.LossGuard (MemoryConfig.LossGuard), the loss marker
//     of the bucket's group: rl:m:{g.<group>}, a string without TTL in the
//     group's slot holding the Redis TIME it was created at. A call that
//     finds a bucket absent reads the marker and creates it when it is
//     missing: its absence is how a loss shows. Each group detects a loss
//     at its first use after it, so the conservative start runs per group
//     from then. A new Redis cannot be told from one that lost its data:
//     with the guard, it too starts buckets this way for a refill time.
//
// What remains: a key evicted while its group's marker stays (use
// maxmemory-policy noeviction; the store reports OOM as ErrMemoryFull) and
// a failover to a replica that lags by L (its marker is there; the spending
// of the last L is lost, at most C per bucket beyond the bound) are not
// detected. Since comes from the node's clock and born from Redis TIME:
// a Redis clock behind the node's makes the start more conservative, one
// ahead shortens it by the difference.
//
// # Sub-buckets
//
// Limits.Shards = K > 1 splits every bucket of those limits into K
// sub-buckets, named "<subject>.s<i>", or in a Redis store "<subject>.<n>"
// with n chosen so that sub-bucket i's group lies in the i-th of K equal
// cluster slot ranges ('.' is outside the subject alphabet), for a coarse limit whose single key
// would take every request on one Redis master. They divide f·C exactly
// (whole tokens as evenly as integers allow, the fraction of a token on the
// first) and f·r in proportion (rounded down, never more). A take tries one
// at random, then the others, then takes the cost from several at once, so
// a denial means that neither one nor their sum held the cost. Each
// sub-bucket follows every rule above on its own. State and TokenState are
// single buckets and ignore Shards. docs/hotkey.md has the details and the
// benchmark.
//
// Peek is a Take of cost 0: it reports without consuming. Refund gives
// cost back, never above capacity (window algorithms subtract it from the
// current window's count; a sliding log drops its newest entries).
//
// # Invariants
//
// Every bucket expires IdleTTL after its last write (for a token bucket in
// Redis: reads as full from then on, and is deleted later, see Redis
// layout), and Limits.Validate makes IdleTTL cover a full refill (or the
// window(s)), so an expired bucket behaves exactly like a new one (full,
// or filled to the share not withheld). With the coordinator's Σf ≤ 1+ε,
// the clamp above and new buckets filled only to the lowest share of the
// last full refill time, tokens summed over regions never exceed (1+ε)·C. Time that
// steps backward adds nothing and takes nothing.
//
// # Redis
//
// Each algorithm is one Lua script (lua/*.lua, go:embed, with a header
// listing KEYS, ARGV and the reply), assembled as common.lua + algorithm +
// take.lua. Production scripts read Redis TIME only; tests pass a time in
// ARGV[2] (never set outside tests) to drive the differential test.
// DialRedis opens the client (host:port, redis:// or rediss:// URL, or
// comma-separated Redis Cluster seeds), so no other package needs go-redis.
//
// # Redis layout
//
// A subject belongs to one of RedisConfig.Groups groups (FNV-1a of the
// subject modulo Groups; DefaultGroups is 4096), and every Redis key of the
// subject carries its group's hash tag {g.<group>}: all buckets of one
// subject, whatever their policies and algorithms, share a Redis Cluster
// slot, and TakeAll checks them in one script call.
//
//   - Token buckets: rl:v<version>:{g.<group>}:<policy> is a hash holding
//     the token buckets of that policy version in that group; field = the
//     subject (subjects over 48 bytes: "~" and a 32-character digest, so
//     no field leaves the listpack encoding), value = 17 packed bytes
//     (ts, tokens, the capacity they were written at). The per-key
//     overhead of Redis (dict entry, key string, object, expires entry) is
//     paid once per group instead of once per bucket; TestRedisBytesPerBucket
//     holds a live token bucket under 100 bytes of Redis memory
//     (docs/performance.md has the measured figure).
//   - Fixed window, sliding window and sliding log keep a string key of
//     their own, rl:v<version>:{g.<group>}:<policy>:<subject>, with a PX
//     TTL (their values are larger or, for the log, unbounded by the
//     listpack limit; grouping them would save less).
//
// Key.String, "rl:v<version>:{<subject>}:<policy>", is the bucket's name
// in logs, errors and caches; (*Redis).Location gives its Redis key and
// field. All nodes that share a Redis must use the same Groups, as they use
// the same policy version: another value puts the buckets under other keys,
// where they start full.
//
// With LossGuard, each group also has its loss marker, rl:m:{g.<group>}
// (see Lost state and key versions): at most Groups small string keys
// without TTL, created at a group's first use and kept for good.
//
// Expiry of token buckets: Redis 7.0 has no per-field TTL. Each write sets
// the group's PEXPIRE to the policy's IdleTTL, so a group idle for its TTL
// disappears (DBSIZE returns to its baseline, plus the loss markers). A field whose stored ts is
// IdleTTL or more in the past reads exactly like a missing one (a full
// bucket: Limits.Validate makes IdleTTL cover a full refill). Each write
// that creates a field (a take, or a lease grant to a new subject: the
// lease script prunes the same way, TestRedisGroupPruneBound/lease)
// samples 4 random fields of its group (HRANDFIELD)
// and deletes those idle for two TTLs or more (the second TTL keeps a
// Redis TIME that steps back by less than one TTL from reviving a deleted
// bucket). Only creations add fields, each adds one and removes 4·S/N
// stale ones in expectation (S stale of N fields), so a group that keeps
// receiving writes holds in expectation at most 4/3 of the subjects it
// saw in the last two TTLs (TestRedisGroupPruneBound/take: 260 fields for 200
// such subjects, where 2,000 subjects passed through), and a group that
// stops receiving writes vanishes one TTL later. Callers that share a group
// with different IdleTTLs (a rolling policy reload) change no decision when
// the policy refills, since every valid IdleTTL covers a full refill; with
// RefillPerSecond 0 the TTL is the allowance period, and they must agree.
//
// # Leases
//
// Memory and Redis also implement Leaser: a token bucket's refill and
// tokens can be handed out as time-bounded leases (a rate and a burst
// until an end) to holders that decide on their own, such as Envoys over
// RLQS. One atomic call grants, renews or releases a lease with the
// bucket; while a lease lives the bucket refills only through lease calls
// (the refill no lease holds), so the bucket and its leases together
// admit no more than the bucket alone would. lease.go has the model and
// the argument; lua/lease.lua the script (the group's hash tag, a lease
// set rl:lease:v<version>:{g.<group>}:<policy>:<subject> beside it).
//
// # Concurrency and zero values
//
// Memory and Redis are safe for concurrent use. Memory starts no goroutine
// (Run sweeps if the caller runs it); NewRedis starts the flushers that
// pipeline concurrent calls, and Close stops them. Within a pipeline, a
// flusher merges up to RedisConfig.Merge single-bucket takes (or refunds)
// into one script call that decides each bucket on its own and in order,
// reading each just before deciding it, so a merged call decides as the
// same calls one after the other would (TestRedisMergedTakesAreExact); it
// saves Redis a script call's fixed cost per decision. The zero Memory and the
// zero Redis are not usable: build them with NewMemory and NewRedis. The
// zero State and TokenState are absent buckets, which behave as full ones
// (neither is safe for concurrent use). The zero Limits are invalid; the
// zero Key is invalid (build keys with NewKey, which validates every part,
// or with NewSubjectKey from a Subject, valid by construction: HashedSubject
// or ParseSubject); the zero Decision denies.
package bucket
