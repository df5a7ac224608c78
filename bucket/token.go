package bucket

import (
	"math"
	"time"
)

// TokenState is one token bucket held by its owner, like State, in 32 bytes
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
	ts, tokens, lim float64 // the stored timestamp (µs), tokens and capacity (units), as in Redis
	lw              int64   // the last write (µs) XOR tokenPresent; 0: absent
}

// tokenPresent marks a written TokenState: lw holds lastWrite^tokenPresent,
// so the zero value (lastWrite math.MinInt64, before any time.Time's
// microseconds) means absent.
const tokenPresent = math.MinInt64

// TokenLimits are a token bucket's limits at one share, checked and
// converted once (Prepared.TokenLimits), for a caller that decides many
// batches at a few shares, as the simulator does. The zero TokenLimits is
// not usable (TakeUnitsWith rejects it). Read-only, safe for concurrent use.
type TokenLimits struct {
	lim, rate, cost float64 // units; units per µs; one request in units
	fill            float64 // units an absent bucket starts with (lim: full)
	ttlUs           int64   // idle TTL in µs
	ok              bool
}

// TokenLimits checks share as State.TakeAt does and returns l's token
// bucket limits at that share. Errors report limits that are not a token
// bucket's or not built by Prepare, a share outside (0, 1+ε], or f·C above
// MaxCapacity.
func (l *Prepared) TokenLimits(share float64) (TokenLimits, error) {
	var p params
	if err := l.params(share, 1, &p); err != nil {
		return TokenLimits{}, err
	}
	if p.alg != algTB {
		return TokenLimits{}, l.notTokenErr()
	}
	return TokenLimits{lim: p.lim, rate: p.p, cost: p.cost, fill: p.fill, ttlUs: p.ttl * 1000, ok: true}, nil
}

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
	tl, err := l.TokenLimits(share)
	if err != nil {
		return 0, err
	}
	return s.TakeUnitsWith(now, &tl, n)
}

// TakeUnitsWith is TakeUnitsAt with the limits at the share converted
// once. Errors report zero limits or a negative n, and leave s unchanged.
// Use one Prepared's limits with a TokenState (shares may differ).
func (s *TokenState) TakeUnitsWith(now time.Time, l *TokenLimits, n int64) (int64, error) {
	return s.TakeUnitsMicros(now.UnixMicro(), l, n)
}

// TakeUnitsMicros is TakeUnitsWith at now given in Unix microseconds, for a
// caller that keeps its clock as a number (the simulator).
func (s *TokenState) TakeUnitsMicros(us int64, l *TokenLimits, n int64) (int64, error) {
	if !l.ok || n < 0 {
		return 0, unitsErr(l, n)
	}
	if n == 0 {
		return 0, nil
	}
	ttlUs := l.ttlUs
	lim, rate, cost, ttl, nowF := l.lim, l.rate, l.cost, float64(ttlUs), float64(us)

	// The first take reads the stored bucket (State.into, decideTB).
	lw, exists := int64(0), false
	if s.lw != 0 {
		if last := s.lw ^ tokenPresent; us-last < ttlUs {
			lw, exists = last, true
		}
	}
	tokens, ts, t, wr := tbRead(lim, l.fill, rate, exists && nowF-s.ts < ttl, s.ts, s.tokens, s.lim, nowF)
	if tokens < cost {
		// Denied, and so is every later take of the batch: only a share
		// change (a clamp, a grown capacity) is written.
		if wr {
			if rate == 0 {
				ts = t
			}
			s.store(ts, tokens, lim, lw, us)
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
	s.store(ts, tokens, lim, lw, us)
	return a, nil
}

// ShareGrew reports whether s was last written at a lower capacity than
// l's (a lower share): a take at l then refills the time since that write
// at the old share, up to the old capacity, so a bucket left alone is full
// only to the old capacity until it is written again. An absent s reports
// false.
func (s *TokenState) ShareGrew(l *TokenLimits) bool {
	return s.lw != 0 && s.lim < l.lim
}

// store writes the bucket as State.commit does: lastWrite is the later of
// the previous one (0 when the bucket was absent) and us.
func (s *TokenState) store(ts, tokens, lim float64, lw, us int64) {
	s.ts, s.tokens, s.lim, s.lw = ts, tokens, lim, max(lw, us)^tokenPresent
}

// notTokenErr explains why TokenLimits refused limits l.
//
//go:noinline
func (l *Prepared) notTokenErr() error {
	return requestErr("algorithm %q: a TokenState holds token buckets only", l.limits.Algorithm)
}

// unitsErr explains why TakeUnitsWith refused l or n.
//
//go:noinline
func unitsErr(l *TokenLimits, n int64) error {
	if n < 0 {
		return requestErr("%d requests, want ≥ 0", n)
	}
	return requestErr("token limits not converted (build them with Prepared.TokenLimits)")
}
