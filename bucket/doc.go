// Package bucket turns "capacity C, refill r per second, share f, cost w"
// into one atomic admission decision, in Redis (Redis) or in process
// (Memory). Memory is the specification: a differential test drives both
// through the same random sequences and demands equal decisions.
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
//     them back; when it grows, no token is added at once, only refill at
//     the new f·r. A cost above f·C is denied with RetryAfter = a full
//     refill at this share (the share must grow first). RefillPerSecond 0
//     means an allowance of f·C per IdleTTL after the last write.
//   - FixedWindow: Envoy's rate limit service windows (aligned to multiples
//     of Window since the Unix epoch); unlike Envoy a denied hit is not
//     counted, which gives the same decisions for unit costs.
//   - SlidingWindow: previous window's count weighted by its part still
//     inside the sliding window, plus the current count.
//   - SlidingLog: exact; one entry per admission, at most f·C entries
//     (C ≤ MaxSlidingLogCapacity, f ≤ 1+ε ≤ 2: at most 2000 entries, 11 bytes
//     each in Redis).
//
// Peek is a Take of cost 0: it reports without consuming. Refund gives
// cost back, never above capacity (window algorithms subtract it from the
// current window's count; a sliding log drops its newest entries).
//
// # Invariants
//
// Every bucket expires IdleTTL after its last write, and Limits.Validate
// makes IdleTTL cover a full refill (or the window(s)), so an expired bucket
// behaves exactly like a full one. With the coordinator's Σf ≤ 1+ε and the
// clamp above, tokens summed over regions never exceed (1+ε)·C. Time that
// steps backward adds nothing and takes nothing.
//
// # Redis
//
// Each algorithm is one Lua script (lua/*.lua, go:embed, with a header
// listing KEYS, ARGV and the reply), assembled as common.lua + algorithm +
// take.lua. Production scripts read Redis TIME only; tests pass a time in
// ARGV[2] (never set outside tests) to drive the differential test. A token
// bucket is one string of 12 bytes (two packed integers) with a PX TTL. The
// keys are Key.String(): the subject is a hash tag, so one subject's buckets
// share a Redis Cluster slot and TakeAll checks them in one script call.
//
// # Concurrency and zero values
//
// Memory and Redis are safe for concurrent use. Memory starts no goroutine
// (Run sweeps if the caller runs it); NewRedis starts the flushers that
// pipeline concurrent calls, and Close stops them. The zero Memory and the
// zero Redis are not usable: build them with NewMemory and NewRedis. The
// zero Limits are invalid; the zero Key is invalid (build keys with NewKey);
// the zero Decision denies.
package bucket
