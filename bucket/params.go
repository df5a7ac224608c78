package bucket

import (
	"math"
	"time"
)

// unitsPerToken is the fixed-point scale of every stored amount: buckets
// count milli-tokens ("units") so that a fractional share or refill loses
// nothing visible.
const unitsPerToken = 1000

// Operations of the bucket scripts.
const (
	opTake   = 't'
	opRefund = 'r'
)

// Algorithm codes, as the scripts name them.
const (
	algTB = iota
	algFW
	algSW
	algSL
)

var algCodes = [...]string{algTB: "tb", algFW: "fw", algSW: "sw", algSL: "sl"}

// params is one request turned into the numbers the scripts and the
// reference model both work on. Every field is an integer-valued float64
// except rate.
type params struct {
	alg  int
	lim  float64 // capacity f·C in units, floored
	fill float64 // token bucket: what a bucket the call creates starts with, in units (lim: full)
	p    float64 // token bucket: refill f·r in units per microsecond; else window in microseconds
	cost float64 // units
	ttl  int64   // idle TTL in milliseconds, rounded up
	// since is Request.Since in microseconds (0: none).
	since float64
	// born (Memory and State only, set per call) is the instant an absent
	// bucket reads as lost at: the later of since and the store's loss
	// marker; 0 when an absent bucket is simply new. Redis computes it in
	// the script (lua/take.lua).
	born float64
}

// maxInstant bounds Request.Since in microseconds: every stored number
// stays below 2^53 (see the package doc).
const maxInstant = 1 << 53

// paramsOf converts a validated request.
func paramsOf(r *Request) params {
	l := &r.Limits
	p := params{
		lim:  math.Floor(r.Share * float64(l.Capacity) * unitsPerToken),
		cost: r.costUnits(),
		ttl:  int64((l.IdleTTL + time.Millisecond - 1) / time.Millisecond),
	}
	if !r.Since.IsZero() {
		p.since = float64(r.Since.UnixMicro())
	}
	p.fill = fillUnits(p.lim, r.Share, r.Withheld, float64(l.Capacity))
	switch l.Algorithm {
	case "", TokenBucket:
		p.alg = algTB
		p.p = r.Share * l.RefillPerSecond / 1000 // units per microsecond
	case FixedWindow:
		p.alg = algFW
		p.p = float64(l.Window.Microseconds())
	case SlidingWindow:
		p.alg = algSW
		p.p = float64(l.Window.Microseconds())
	case SlidingLog:
		p.alg = algSL
		p.p = float64(l.Window.Microseconds())
	}
	if l.shard > 0 {
		p.split(int(l.shard)-1, l.Shards)
	}
	return p
}

// decision converts script numbers (units, microseconds) to a Decision
// made at us (microseconds since the Unix epoch), in UTC.
func decision(allowed bool, lim, rem, retry, reset float64, us int64) Decision {
	return Decision{
		At:         time.UnixMicro(us).UTC(),
		Allowed:    allowed,
		Limit:      lim / unitsPerToken,
		Remaining:  rem / unitsPerToken,
		RetryAfter: time.Duration(retry) * time.Microsecond,
		ResetAfter: time.Duration(reset) * time.Microsecond,
	}
}

// fillUnits is what a token bucket created at share of capacity starts
// with, in units, when withheld of the share is withheld from it
// (Request.Withheld): lim, the full capacity in units, when nothing is.
func fillUnits(lim, share, withheld, capacity float64) float64 {
	if withheld <= 0 {
		return lim
	}
	// Share − Withheld is the caller's lower share come back through a
	// subtraction (0.8 − 0.6000000000000001): a millionth of a unit of
	// slack keeps its float error from costing a whole unit.
	return min(lim, math.Floor(max(0, share-withheld)*capacity*unitsPerToken+1e-6))
}
