package bucket

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Bounds checked by Validate. They keep every amount an exact integer in
// both Go float64 and Redis Lua doubles (below 2^53) and keep the packed
// Redis value small.
const (
	// MaxCapacity is the largest Capacity; f·C must stay below it as well,
	// so that f·C in milli-tokens fits the 40-bit field of a stored bucket.
	MaxCapacity = 500_000_000
	// MaxSlidingLogCapacity is the largest Capacity of a SlidingLog policy:
	// a log keeps one entry per admission, at most f·C entries.
	MaxSlidingLogCapacity = 1000
	// MaxRefillPerSecond is the largest RefillPerSecond.
	MaxRefillPerSecond = 1e9
	// MaxOvercommit is the largest Overcommit ε.
	MaxOvercommit = 1.0
	// MaxIdleTTL is the longest IdleTTL.
	MaxIdleTTL = 366 * 24 * time.Hour
	// MinWindow is the shortest Window of the window algorithms.
	MinWindow = time.Millisecond
	// MaxTakeAll is the most requests one TakeAll checks.
	MaxTakeAll = 16
)

var (
	// ErrInvalidLimits reports limits that Limits.Validate rejects.
	ErrInvalidLimits = errors.New("bucket: invalid limits")
	// ErrInvalidRequest reports a request that Request.Validate rejects.
	ErrInvalidRequest = errors.New("bucket: invalid request")
)

func limitsErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidLimits, fmt.Sprintf(format, args...))
}

func requestErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// Validate reports whether l can be enforced. It rejects an unknown
// algorithm; a capacity outside 1..MaxCapacity (1..MaxSlidingLogCapacity
// for SlidingLog); a refill that is negative, NaN, infinite or above
// MaxRefillPerSecond (zero is allowed for TokenBucket: the bucket then
// becomes full again only IdleTTL after its last write); a window below
// MinWindow for the window algorithms; an IdleTTL outside
// 1ms..MaxIdleTTL or shorter than a full refill (Capacity/RefillPerSecond),
// a window (FixedWindow, SlidingLog) or two windows (SlidingWindow); an
// overcommit outside [0, MaxOvercommit]; and shards outside 0..MaxShards.
func (l Limits) Validate() error {
	alg := l.Algorithm
	if alg == "" {
		alg = TokenBucket
	}
	switch alg {
	case TokenBucket, FixedWindow, SlidingWindow, SlidingLog:
	default:
		return limitsErr("unknown algorithm %q", l.Algorithm)
	}
	if l.Capacity <= 0 || l.Capacity > MaxCapacity {
		return limitsErr("capacity %d outside 1..%d", l.Capacity, MaxCapacity)
	}
	if alg == SlidingLog && l.Capacity > MaxSlidingLogCapacity {
		return limitsErr("sliding log capacity %d above %d (one log entry per admission)", l.Capacity, MaxSlidingLogCapacity)
	}
	if !finite(l.RefillPerSecond) || l.RefillPerSecond < 0 || l.RefillPerSecond > MaxRefillPerSecond {
		return limitsErr("refill %v per second outside 0..%g", l.RefillPerSecond, float64(MaxRefillPerSecond))
	}
	if !finite(l.Overcommit) || l.Overcommit < 0 || l.Overcommit > MaxOvercommit {
		return limitsErr("overcommit %v outside 0..%g", l.Overcommit, MaxOvercommit)
	}
	if l.Shards < 0 || l.Shards > MaxShards {
		return limitsErr("shards %d outside 0..%d", l.Shards, MaxShards)
	}
	if l.IdleTTL < time.Millisecond || l.IdleTTL > MaxIdleTTL {
		return limitsErr("idle TTL %v outside 1ms..%v", l.IdleTTL, MaxIdleTTL)
	}
	switch alg {
	case TokenBucket:
		if l.RefillPerSecond > 0 {
			full := float64(l.Capacity) / l.RefillPerSecond // seconds
			if l.IdleTTL.Seconds() < full {
				return limitsErr("idle TTL %v shorter than a full refill (%gs)", l.IdleTTL, full)
			}
		}
	default:
		if l.Window < MinWindow || l.Window > MaxIdleTTL {
			return limitsErr("window %v outside %v..%v", l.Window, MinWindow, MaxIdleTTL)
		}
		need, what := l.Window, "the window"
		if alg == SlidingWindow {
			need, what = 2*l.Window, "two windows"
		}
		if l.IdleTTL < need {
			return limitsErr("idle TTL %v shorter than %s (%v)", l.IdleTTL, what, need)
		}
	}
	return nil
}

// Validate reports whether r can be decided: its key was built by NewKey,
// its limits are valid, its share f is finite with 0 < f ≤ 1+ε, its cost
// lies in 0..Capacity, and f·C stays at most MaxCapacity. A cost above f·C
// (but within C) is valid: the bucket denies it at this share.
func (r Request) Validate() error {
	if r.Key.IsZero() {
		return requestErr("key not set (build it with NewKey)")
	}
	if err := r.Limits.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if !finite(r.Share) || r.Share <= 0 || r.Share > 1+r.Limits.Overcommit {
		return requestErr("share %v outside (0, %g]", r.Share, 1+r.Limits.Overcommit)
	}
	if !finite(r.Withheld) || r.Withheld < 0 || r.Withheld > r.Share {
		return requestErr("withheld share %v outside [0, %v] (the share)", r.Withheld, r.Share)
	}
	if !r.Since.IsZero() && (r.Since.UnixMicro() <= 0 || r.Since.UnixMicro() >= maxInstant) {
		return requestErr("since %v outside the Unix epoch..year 2255", r.Since)
	}
	if r.Cost < 0 || r.Cost > r.Limits.Capacity {
		return requestErr("cost %d outside 0..%d (capacity)", r.Cost, r.Limits.Capacity)
	}
	if r.Share*float64(r.Limits.Capacity) > MaxCapacity {
		return requestErr("share × capacity %g above %d", r.Share*float64(r.Limits.Capacity), MaxCapacity)
	}
	return nil
}
