package bucket

import "math"

// This file is the reference model: the same decisions as lua/*.lua, the
// same float64 expressions in the same order. A change here needs the same
// change there (the differential test catches a mismatch).

// state is one bucket's stored value.
type state struct {
	a, b, c   float64     // tb: ts, tokens, capacity written at; fw: window start, count; sw: window start, prev, cur
	log       *[]logEntry // sl only, oldest first; boxed so that the other algorithms' states stay small
	lastWrite int64       // microseconds; the latest now at which the bucket was written
	ttl       int64       // idle TTL in microseconds
}

type logEntry struct{ ts, cost float64 } // microseconds, units

type write uint8

const (
	writeNone write = iota
	writeSet
	writeDel
)

// outcome is one bucket's decision in script units. A write stores a, b
// and c as the state's a, b and c and, for a sliding log, log.
type outcome struct {
	ok                bool
	w                 write
	rem, retry, reset float64
	a, b, c           float64
	log               []logEntry
}

// decide mirrors ALG[...] of the scripts. st is the stored state when
// exists; it is never modified unless the outcome writes.
func decide(p *params, op byte, st *state, exists bool, now float64, charge bool) outcome {
	ttl := float64(p.ttl * 1000)
	switch p.alg {
	case algFW:
		return decideFW(p, op, st, exists, now, charge)
	case algSW:
		return decideSW(p, op, st, exists, now, charge)
	case algSL:
		return decideSL(p, op, st, exists, now, charge)
	}
	var o outcome
	decideTB(p, op, st, exists, now, ttl, charge, &o)
	return o
}

// decideTB writes the token bucket's outcome into o (which it overwrites
// whole), saving the copy of a returned outcome on the hot paths.
func decideTB(p *params, op byte, st *state, exists bool, now, ttl float64, charge bool, o *outcome) {
	lim, rate, cost := p.lim, p.p, p.cost
	var tokens, ts, t float64
	var wr bool
	if stored := exists && now-st.a < ttl; !stored && p.born > 0 && now-p.born < ttl {
		// Lost at born: emptied then, refilled since, at most fill;
		// written when below full (with no refill it stays empty until
		// ttl after born, which needs no write).
		tokens, ts, t, _ = tbRead(lim, lim, rate, true, p.born, 0, lim, now)
		if tokens > p.fill {
			tokens, ts = p.fill, t
		}
		wr = tokens < lim && rate > 0
	} else {
		tokens, ts, t, wr = tbRead(lim, p.fill, rate, stored, st.a, st.b, st.c, now)
	}
	*o = outcome{ok: true}
	if op == opRefund {
		if cost > 0 {
			tokens += cost
			if tokens > lim {
				tokens = lim
			}
			wr = true
		}
	} else if cost > 0 {
		if tokens >= cost {
			if charge {
				tokens -= cost
				wr = true
			}
		} else {
			o.ok = false
		}
	}
	if wr && rate == 0 {
		ts = t
	}
	if !o.ok {
		switch {
		case cost > lim:
			if rate > 0 {
				o.retry = math.Ceil(lim / rate)
			} else {
				o.retry = ttl
			}
		case rate > 0:
			o.retry = math.Ceil((cost-tokens)/rate - (t - ts))
		default:
			o.retry = ttl - (t - ts)
		}
		if o.retry < 1 {
			o.retry = 1
		}
	}
	if tokens < lim {
		if rate > 0 {
			o.reset = math.Ceil((lim-tokens)/rate - (t - ts))
		} else {
			o.reset = ttl - (t - ts)
		}
		if o.reset < 0 {
			o.reset = 0
		}
	}
	o.rem = tokens
	if wr {
		o.w = writeSet
		o.a, o.b, o.c = ts, tokens, lim
	}
}

// tbRead reads a token bucket at now for capacity lim (units) and refill
// rate (units per µs): the stored ts, tokens and capacity written at when
// stored (live, and ts within the idle TTL), else a new bucket holding
// fill ≤ lim (written when below full, so that it refills from now). A lower
// capacity clamps the tokens; a higher one (the share grew) refills the time
// since ts at the stored share, rate·sLim/lim, up to sLim, and drops the
// fraction of a unit. Either change must be written (wr). t is the later of
// now and ts. The same expressions as the scripts'.
func tbRead(lim, fill, rate float64, stored bool, sTs, sTokens, sLim, now float64) (tokens, ts, t float64, wr bool) {
	tokens, ts = lim, now
	flim, frate := lim, rate // what the time since ts refills at
	if !stored && fill < lim {
		tokens, wr = fill, true
	}
	if stored {
		tokens, ts = sTokens, sTs
		if tokens > lim {
			tokens = lim // the share shrank: clamp, and write the clamp
			wr = true
		}
		if sLim < lim {
			flim, frate = sLim, rate*sLim/lim
			wr = true
		}
	}
	t = now
	if ts > t {
		t = ts
	}
	tokens, ts = tbRefill(flim, frate, tokens, ts, t)
	if flim < lim {
		ts = t // a fraction of a unit at the old refill is not carried over
	}
	return tokens, ts, t, wr
}

// tbRefill is the token bucket's refill at t (the later of now and the
// stored ts) from tokens stored at ts: whole units only, the remainder
// carried in the returned ts. The same expressions as the scripts'.
func tbRefill(lim, rate, tokens, ts, t float64) (float64, float64) {
	if tokens >= lim {
		return tokens, t
	}
	if rate > 0 {
		added := math.Floor(float64((t - ts) * rate))
		if tokens+added >= lim {
			return lim, t
		}
		if added > 0 {
			tokens += added
			adv := ts + math.Ceil(added/rate)
			if adv < t {
				ts = adv
			} else {
				ts = t
			}
		}
	}
	return tokens, ts
}

func decideFW(p *params, op byte, st *state, exists bool, now float64, charge bool) outcome {
	lim, win, cost := p.lim, p.p, p.cost
	ws := math.Floor(now/win) * win
	count := 0.0
	if !exists && p.born > 0 {
		// Lost at born: full in born's window.
		st, exists = &state{a: math.Floor(p.born/win) * win, b: lim}, true
	}
	if exists {
		if st.a > ws {
			ws = st.a
		}
		if st.a == ws {
			count = st.b
		}
	}
	o := outcome{ok: true}
	wr := false
	if op == opRefund {
		if cost > 0 && count > 0 {
			count -= cost
			if count < 0 {
				count = 0
			}
			wr = true
		}
	} else if cost > 0 {
		if count+cost <= lim {
			if charge {
				count += cost
				wr = true
			}
		} else {
			o.ok = false
		}
	}
	o.reset = ws + win - now
	if !o.ok {
		o.retry = o.reset
	}
	o.rem = math.Max(lim-count, 0)
	if wr {
		o.w = writeSet
		o.a, o.b = ws, count
	}
	return o
}

func decideSW(p *params, op byte, st *state, exists bool, now float64, charge bool) outcome {
	lim, win, cost := p.lim, p.p, p.cost
	ws := math.Floor(now/win) * win
	prev, cur := 0.0, 0.0
	if !exists && p.born > 0 {
		// Lost at born: a full count in born's window.
		st, exists = &state{a: math.Floor(p.born/win) * win, c: lim}, true
	}
	if exists {
		if st.a > ws {
			ws = st.a
		}
		if st.a == ws {
			prev, cur = st.b, st.c
		} else if st.a == ws-win {
			prev = st.c
		}
	}
	t := now
	if ws > t {
		t = ws
	}
	e := t - ws
	est := float64(prev*(win-e))/win + cur
	o := outcome{ok: true}
	wr := false
	if op == opRefund {
		if cost > 0 && cur > 0 {
			cur -= cost
			if cur < 0 {
				cur = 0
			}
			wr = true
		}
	} else if cost > 0 {
		if est+cost <= lim {
			if charge {
				cur += cost
				wr = true
			}
		} else {
			o.ok = false
		}
	}
	if cur > 0 {
		o.reset = ws + 2*win - t
	} else if prev > 0 {
		o.reset = ws + win - t
	}
	if !o.ok {
		switch {
		case cost > lim:
			o.retry = o.reset
		case cur+cost <= lim:
			o.retry = math.Ceil(win-float64((lim-cur-cost)*win)/prev) - e
		default:
			r2 := math.Ceil(win - float64((lim-cost)*win)/cur)
			if r2 < 0 {
				r2 = 0
			}
			o.retry = ws + win - t + r2
		}
		if o.retry < 1 {
			o.retry = 1
		}
	}
	o.rem = math.Floor(lim - (float64(prev*(win-e))/win + cur))
	if o.rem < 0 {
		o.rem = 0
	}
	if wr {
		o.w = writeSet
		o.a, o.b, o.c = ws, prev, cur
	}
	return o
}

func decideSL(p *params, op byte, st *state, exists bool, now float64, charge bool) outcome {
	lim, win, cost := p.lim, p.p, p.cost
	var log []logEntry
	t := now
	if exists && st.log != nil {
		log = *st.log
	} else if !exists && p.born > 0 {
		// Lost at born: one entry then holding the whole capacity.
		log = []logEntry{{ts: p.born, cost: math.Ceil(lim/1000) * 1000}}
	}
	if n := len(log); n > 0 && log[n-1].ts > t {
		t = log[n-1].ts
	}
	first := 0
	for first < len(log) && log[first].ts <= t-win {
		first++
	}
	log = log[first:]
	sum := 0.0
	for _, e := range log {
		sum += e.cost
	}
	o := outcome{ok: true}
	wr := false
	if op == opRefund {
		left := cost
		for left > 0 && len(log) > 0 {
			last := &log[len(log)-1]
			if last.cost <= left {
				left -= last.cost
				sum -= last.cost
				log = log[:len(log)-1]
			} else {
				last.cost -= left
				sum -= left
				left = 0
			}
			wr = true
		}
	} else if cost > 0 {
		if sum+cost <= lim {
			if charge {
				log = append(log, logEntry{ts: t, cost: cost})
				sum += cost
				wr = true
			}
		} else {
			o.ok = false
		}
	}
	if len(log) > 0 {
		o.reset = log[len(log)-1].ts + win - t
	}
	if !o.ok {
		if cost > lim {
			o.retry = o.reset
		} else {
			freed := 0.0
			for _, e := range log {
				freed += e.cost
				if sum-freed+cost <= lim {
					o.retry = e.ts + win - t
					break
				}
			}
		}
		if o.retry < 1 {
			o.retry = 1
		}
	}
	o.rem = math.Max(lim-sum, 0)
	if wr {
		if len(log) == 0 {
			o.w = writeDel
		} else {
			o.w = writeSet
			o.log = log
		}
	}
	return o
}
