package bucket

import (
	"context"
	"time"
)

// Algorithm names how a bucket turns time and cost into a decision.
type Algorithm string

// The algorithms. TokenBucket is the default (the zero value means it too).
const (
	// TokenBucket holds up to Capacity tokens and refills RefillPerSecond
	// tokens each second; a request of cost w takes w tokens.
	TokenBucket Algorithm = "token_bucket"
	// FixedWindow counts cost per aligned window of length Window and admits
	// while the count stays within Capacity (Envoy's rate limit service).
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindow weights the previous window's count by the part of it
	// still inside the sliding window and adds the current window's count.
	SlidingWindow Algorithm = "sliding_window"
	// SlidingLog keeps one entry per admitted unit of cost and is exact.
	SlidingLog Algorithm = "sliding_log"
)

// Limits are one policy's global limits, before a region's share scales them.
type Limits struct {
	// Algorithm defaults to TokenBucket when empty.
	Algorithm Algorithm
	// Capacity is C: the burst of a token bucket, or the cost admitted per
	// window for the window algorithms.
	Capacity int64
	// RefillPerSecond is r, tokens added per second (TokenBucket only).
	RefillPerSecond float64
	// Window is the window length (window algorithms only).
	Window time.Duration
	// IdleTTL is how long a bucket lives after its last write. It must cover
	// a full refill (Capacity/RefillPerSecond) or a window (two for
	// SlidingWindow), so an expired bucket behaves like a full one.
	IdleTTL time.Duration
	// Overcommit is ε: the share passed with a request may be at most 1+ε.
	Overcommit float64
	// Shards splits every bucket of these limits into that many
	// sub-buckets, for a coarse limit (one subject for a whole API) whose
	// single bucket would put one Redis key under every request: 0 or 1
	// keeps one bucket, at most MaxShards. The sub-buckets divide the
	// region's capacity f·C exactly (whole tokens as evenly as integers
	// allow, the fraction of a token on the first) and its refill f·r in
	// proportion, each under the growth and shrink rules of one bucket;
	// a Redis store puts them on different cluster slots. A take goes to
	// one sub-bucket at random, falls back to the others when it denies,
	// and takes a cost that no single one holds from several at once, so
	// a denial means no sub-bucket (nor their sum, in whole tokens) held
	// the cost when read. State and TokenState (single buckets) ignore
	// it. docs/hotkey.md has the details and figures.
	Shards int

	// shard is set on the requests a store makes for one sub-bucket:
	// sub-bucket shard-1 of Shards (0: the whole bucket).
	shard uint8
}

// Request asks a bucket for a decision.
type Request struct {
	// Key names the bucket; build it with NewKey.
	Key Key
	// Limits are the policy's global limits.
	Limits Limits
	// Share is the region's share f of the policy's budget for this subject:
	// the bucket enforces capacity f·C and refill f·r. 0 < f ≤ 1+ε.
	Share float64
	// Cost is the weight of the request. Zero peeks: the decision reports
	// the bucket without consuming anything.
	Cost int64
	// Withheld is the part of Share that a token bucket this request
	// creates (absent from the store: never written, or idle past its
	// TTL) does not start with: such a bucket starts with
	// (Share − Withheld)·C tokens instead of full, is written at once,
	// and refills from there at f·r. A region passes Share minus the
	// lowest share it held during the last full refill time (C/r), so
	// that a subject that spent its budget in another region does not
	// find this region's grown share full. 0 ≤ Withheld ≤ Share; zero
	// starts a new bucket full. Window algorithms ignore it.
	Withheld float64
	// Since is when the bucket's key version came into force, zero when
	// that is long past (longer than the bucket's idle TTL) or unknown.
	// Under a key that is younger than the bucket's refill time, an
	// absent bucket may be one whose spending happened under the policy's
	// previous version (other keys): the store reads it as a bucket lost
	// at Since, emptied (token bucket) or filled (window algorithms) at
	// that instant, as after a loss of the store's state (see Memory and
	// RedisConfig.LossGuard). A regional node passes the instant it
	// loaded a policy whose limits changed.
	Since time.Time

	// units, when set, is the cost in milli-tokens, in place of Cost
	// (which then is units rounded up to a token, for validation): the
	// part of a split take that one sub-bucket pays (see Limits.Shards).
	units int64
}

// costUnits is the request's cost in milli-tokens.
func (r *Request) costUnits() float64 {
	if r.units > 0 {
		return float64(r.units)
	}
	return float64(r.Cost) * unitsPerToken
}

// Decision is the answer for one request. A denial is a decision, not an error.
type Decision struct {
	// Allowed reports whether the cost was admitted (always true for a peek
	// of a bucket that holds at least nothing).
	Allowed bool
	// Limit is the capacity the bucket enforced, f·C.
	Limit float64
	// Remaining is what the bucket holds after the decision.
	Remaining float64
	// RetryAfter is how long until the denied cost would be admitted; zero
	// when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again (token bucket)
	// or the window ends (window algorithms).
	ResetAfter time.Duration
	// At is the store's instant of the decision, to the microsecond: Redis
	// TIME for Redis, the instant passed in (or the Memory's clock) for
	// Memory. Every figure above is relative to it.
	At time.Time
}

// Store makes decisions. Memory and Redis implement it with the same
// semantics; Memory is the specification.
type Store interface {
	// Take charges req.Cost when the bucket holds it and reports the result.
	Take(ctx context.Context, req Request) (Decision, error)
	// TakeAll checks several buckets of one subject all or nothing: either
	// every request is admitted and charged, or none is charged. It is one
	// atomic script call when the buckets share a Redis slot (always on a
	// single server); across slots a denial refunds what was charged, so
	// a concurrent check may see those tokens gone for that moment.
	TakeAll(ctx context.Context, reqs []Request) ([]Decision, error)
	// Refund gives back req.Cost tokens for an operation that did not happen,
	// never above capacity.
	Refund(ctx context.Context, req Request) (Decision, error)
}
