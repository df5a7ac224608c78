package bucket

import (
	"math"
	"time"
)

// Prepared is a policy's Limits validated once and converted to the numbers
// the decision code works on, so that code holding many buckets of one
// policy (the simulator, a batch) checks only the share and cost per call.
// Build it with Prepare; the zero Prepared is not usable (State rejects it).
// A Prepared is read-only after Prepare and safe for concurrent use.
type Prepared struct {
	limits Limits
	alg    int
	capF   float64 // Capacity as float64
	refill float64 // RefillPerSecond
	window float64 // window in microseconds (window algorithms)
	ttlMs  int64   // IdleTTL in milliseconds, rounded up
	maxF   float64 // 1 + Overcommit
	ok     bool
}

// Prepare validates l (Limits.Validate) and returns its prepared form.
func Prepare(l Limits) (Prepared, error) {
	if err := l.Validate(); err != nil {
		return Prepared{}, err
	}
	p := Prepared{limits: l, capF: float64(l.Capacity), refill: l.RefillPerSecond,
		window: float64(l.Window.Microseconds()),
		ttlMs:  int64((l.IdleTTL + time.Millisecond - 1) / time.Millisecond),
		maxF:   1 + l.Overcommit, ok: true}
	switch l.Algorithm {
	case "", TokenBucket:
		p.alg = algTB
	case FixedWindow:
		p.alg = algFW
	case SlidingWindow:
		p.alg = algSW
	case SlidingLog:
		p.alg = algSL
	}
	return p, nil
}

// Limits returns the limits p was prepared from.
func (p *Prepared) Limits() Limits { return p.limits }

// params checks share and cost as Request.Validate does and returns what
// paramsOf returns for the equivalent Request (the same float64 expressions
// in the same order). The checks are one expression so that the fast path
// stays small; paramsErr says what was wrong.
func (p *Prepared) params(share float64, cost int64, q *params) error {
	if !p.ok || !(share > 0 && share <= p.maxF) || cost < 0 || cost > p.limits.Capacity || share*p.capF > MaxCapacity {
		return p.paramsErr(share, cost)
	}
	q.alg = p.alg
	q.lim = math.Floor(share * p.capF * unitsPerToken)
	q.fill = q.lim
	q.cost = float64(cost) * unitsPerToken
	q.ttl = p.ttlMs
	if p.alg == algTB {
		q.p = share * p.refill / 1000 // units per microsecond
	} else {
		q.p = p.window
	}
	return nil
}

// paramsErr explains why params rejected share and cost.
//
//go:noinline
func (p *Prepared) paramsErr(share float64, cost int64) error {
	switch {
	case !p.ok:
		return requestErr("limits not prepared (build them with Prepare)")
	case !finite(share) || share <= 0 || share > p.maxF:
		return requestErr("share %v outside (0, %g]", share, p.maxF)
	case cost < 0 || cost > p.limits.Capacity:
		return requestErr("cost %d outside 0..%d (capacity)", cost, p.limits.Capacity)
	default:
		return requestErr("share × capacity %g above %d", share*p.capF, MaxCapacity)
	}
}

// State is one bucket held by its owner instead of a store: the exact
// per-bucket decision logic of Memory (Memory keeps a State per key and
// calls the same code), for a caller that indexes its buckets itself, such
// as the simulator holding one State per subject in a slice.
//
// The zero State is an absent bucket, which behaves as a full one. A State
// expires IdleTTL after its last write, as a Memory bucket (or a Redis key)
// would: it then behaves as a full one again. A State is not safe for
// concurrent use; the caller serialises calls (Memory holds a shard lock).
// Copying a State copies the bucket, except that a SlidingLog State shares
// its log with its copies: do not use both.
type State struct {
	st state // st.ttl == 0: absent
}

// live reports whether the bucket exists at us (written and not expired).
func (s *State) live(us int64) bool {
	return s.st.ttl > 0 && us-s.st.lastWrite < s.st.ttl
}

// absent reports whether a decision at us reads s as absent (never
// written, expired, or a token bucket whose stored ts is a TTL old): the
// case in which a store consults its loss marker (params.born).
func (s *State) absent(p *params, us int64) bool {
	return !s.live(us) || p.alg == algTB && float64(us)-s.st.a >= float64(p.ttl*1000)
}

// step decides op at us without changing s; it returns the outcome and the
// lastWrite the commit must keep (0 when the bucket is absent).
func (s *State) step(p *params, op byte, us int64, charge bool) (outcome, int64) {
	var o outcome
	lw := s.into(p, op, us, charge, &o)
	return o, lw
}

// into is step writing the outcome into o. It calls decideTB itself for a
// token bucket (what decide would dispatch to, with the same arguments),
// saving a copy of the outcome on the simulator's hot path.
func (s *State) into(p *params, op byte, us int64, charge bool, o *outcome) int64 {
	st, exists, lw := &s.st, true, s.st.lastWrite
	if !s.live(us) {
		var zero state
		st, exists, lw = &zero, false, 0
	}
	if p.alg == algTB {
		decideTB(p, op, st, exists, float64(us), float64(p.ttl*1000), charge, o)
	} else {
		*o = decide(p, op, st, exists, float64(us), charge)
	}
	return lw
}

// commit stores what o writes, as Memory.apply does for an existing entry.
func (s *State) commit(p *params, o *outcome, lastWrite, us int64) {
	switch o.w {
	case writeSet:
		var box *[]logEntry
		if p.alg == algSL {
			if box = s.st.log; box == nil {
				box = new([]logEntry)
			}
			*box = o.log
		}
		s.st = state{a: o.a, b: o.b, c: o.c, log: box, ttl: p.ttl * 1000, lastWrite: max(lastWrite, us)}
	case writeDel:
		s.st = state{}
	}
}

// TakeAt charges cost at now when the bucket, at share f of l, holds it
// (cost 0 peeks), exactly as Memory.TakeAt with the same limits, share and
// cost. A denial is a Decision with Allowed false; errors report a share
// outside (0, 1+ε], a cost outside 0..Capacity, f·C above MaxCapacity, or
// limits not built by Prepare. An error leaves s unchanged.
func (s *State) TakeAt(now time.Time, l *Prepared, share float64, cost int64) (Decision, error) {
	return s.one(now, l, share, cost, opTake)
}

// RefundAt gives back cost at now, never above the bucket's capacity,
// exactly as Memory.RefundAt.
func (s *State) RefundAt(now time.Time, l *Prepared, share float64, cost int64) (Decision, error) {
	return s.one(now, l, share, cost, opRefund)
}

func (s *State) one(now time.Time, l *Prepared, share float64, cost int64, op byte) (Decision, error) {
	var p params
	if err := l.params(share, cost, &p); err != nil {
		return Decision{}, err
	}
	us := now.UnixMicro()
	var o outcome
	lw := s.into(&p, op, us, true, &o)
	s.commit(&p, &o, lw, us)
	return decision(o.ok, p.lim, o.rem, o.retry, o.reset, us), nil
}
