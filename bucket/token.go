package bucket

import (
	"math"
	"time"
)

// TokenState is one token bucket held by its owner, like State, in 24 bytes
// and without pointers: a caller that holds many token buckets in a slice
// (the simulator holds one per region and subject) keeps them dense in
// memory, and the garbage collector never scans them.
//
// A TokenState decides exactly as a State (and so as Memory and Redis) for
// a token bucket, provided the caller uses it with one Prepared, whose
// IdleTTL it expires with (the share may change between calls, as with
// State). The zero TokenState is an absent bucket, which behaves as a full
// one. It is not safe for concurrent use.
type TokenState struct {
	ts, tokens float64 // the stored timestamp (µs) and tokens (units), as in Redis
	lw         int64   // the last write (µs) XOR tokenPresent; 0: absent
}

// tokenPresent marks a written TokenState: lw holds lastWrite^tokenPresent,
// so the zero value (lastWrite math.MinInt64, before any time.Time's
// microseconds) means absent.
const tokenPresent = math.MinInt64

// TakeUnitsAt decides n requests of cost 1 that arrive together at now, one
// after the other, in the token bucket at share f of l, and returns how
// many it admitted: what n calls of State.TakeAt with cost 1 would admit,
// leaving the same bucket behind (a test holds it to that). Usually that is
// min(n, whole tokens after refill), decided with one refill instead of n.
//
// Errors report limits that are not a token bucket's or not built by
// Prepare, a share outside (0, 1+ε], f·C above MaxCapacity, or a negative
// n; an error leaves s unchanged. n = 0 changes nothing.
func (s *TokenState) TakeUnitsAt(now time.Time, l *Prepared, share float64, n int64) (int64, error) {
	var p params
	if err := l.params(share, 1, &p); err != nil {
		return 0, err
	}
	if p.alg != algTB || n < 0 {
		return 0, l.unitsErr(n)
	}
	if n == 0 {
		return 0, nil
	}
	us := now.UnixMicro()
	ttlUs := p.ttl * 1000
	lim, rate, cost, ttl, nowF := p.lim, p.p, p.cost, float64(ttlUs), float64(us)

	// The first take reads the stored bucket (State.into, decideTB).
	lw, exists := int64(0), false
	if s.lw != 0 {
		if last := s.lw ^ tokenPresent; us-last < ttlUs {
			lw, exists = last, true
		}
	}
	tokens, ts, clamped := lim, nowF, false
	if exists && nowF-s.ts < ttl {
		tokens, ts = s.tokens, s.ts
		if tokens > lim {
			tokens = lim
			clamped = true
		}
	}
	t := max(nowF, ts)
	tokens, ts = tbRefill(lim, rate, tokens, ts, t)
	if tokens < cost {
		// Denied, and so is every later take of the batch: only a clamp
		// is written.
		if clamped {
			if rate == 0 {
				ts = t
			}
			s.store(ts, tokens, lw, us)
		}
		return 0, nil
	}
	// Admitted: the bucket written is (ts, tokens−cost).
	a := int64(1)
	tokens -= cost
	if rate == 0 {
		ts = t
	}
	for a < n {
		// The next take reads the bucket just written, live at us.
		vtok, vts := tokens, ts
		if !(nowF-vts < ttl) {
			vtok, vts = lim, nowF
		}
		t = max(nowF, vts)
		rtok, rts := tbRefill(lim, rate, vtok, vts, t)
		if rtok < cost {
			break // denied: writes nothing, nor does any later take
		}
		if rtok == tokens && rts == ts {
			// It reads the written bucket unchanged, and so will every
			// later take (nothing it reads changes but tokens, which only
			// fall): the rest is whole tokens, one each.
			k := min(n-a, int64(tokens)/int64(cost))
			tokens -= float64(k) * cost
			a += k
			break
		}
		tokens, ts = rtok-cost, rts
		if rate == 0 {
			ts = t
		}
		a++
	}
	s.store(ts, tokens, lw, us)
	return a, nil
}

// store writes the bucket as State.commit does: lastWrite is the later of
// the previous one (0 when the bucket was absent) and us.
func (s *TokenState) store(ts, tokens float64, lw, us int64) {
	s.ts, s.tokens, s.lw = ts, tokens, max(lw, us)^tokenPresent
}

// unitsErr explains why TakeUnitsAt refused limits l or n.
//
//go:noinline
func (l *Prepared) unitsErr(n int64) error {
	if n < 0 {
		return requestErr("%d requests, want ≥ 0", n)
	}
	return requestErr("algorithm %q: a TokenState holds token buckets only", l.limits.Algorithm)
}
