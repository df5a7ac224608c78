package regionsync

import "time"

// maxShareHistory bounds the past versions of one policy's shares a
// Syncer keeps, and the periods without a lease it remembers.
const maxShareHistory = 16

// pastShares is a version of one policy's shares for this region that
// was in force until the instant until (the monotonic clock) when it was
// replaced.
type pastShares struct {
	until time.Duration
	// def is the share of a subject without an override; lowest the
	// least share of any subject.
	def, lowest float64
	// over holds the overrides, nil when there were none; coarse says
	// they were let go (to bound memory, or merged into a newer entry):
	// every subject then counts at lowest.
	over   map[string]float64
	coarse bool
}

func (p *pastShares) share(subject string) float64 {
	if p.coarse {
		return p.lowest
	}
	if v, ok := p.over[subject]; ok {
		return v
	}
	return p.def
}

// span is a period (the monotonic clock) in which the region held no
// lease and enforced its safe shares.
type span struct{ from, to time.Duration }

// LowestShare returns the lowest share the region enforced for subject
// under policy during the last within, the current share included: the
// shares of every allocation it applied in that time and, for a period
// without a lease, the safe share. A token bucket the region creates for
// subject (absent, or idle-expired) starts at no more than this share of
// the policy's capacity, with within the bucket's full refill time: a
// subject that spent its budget in another region before this region's
// share grew finds no tokens here that the other region may still spend.
//
// History starts at the first read of the allocations after New: a node
// that starts knows nothing of the shares before (it assumes the ones it
// first reads). It keeps at most 16 versions per policy: older ones
// merge into one, which counts every subject at the lowest share any
// subject had. It is lock-free and allocation-free, and checks the lease
// as Share does.
func (s *Syncer) LowestShare(policy, subject string, within time.Duration) float64 {
	t := s.current()
	ps := t.shares.get(policy)
	low := s.shareOf(ps, t.lost, policy, subject)
	if within <= 0 {
		return low
	}
	from := s.monoNow() - within
	if ps != nil {
		for i := range ps.hist {
			if h := &ps.hist[i]; h.until > from {
				low = min(low, h.share(subject))
			}
		}
	}
	for _, sp := range t.lostSpans {
		if sp.to > from {
			low = min(low, s.shareOf(ps, true, policy, subject))
			break
		}
	}
	return low
}

// past summarizes prev, the shares of policy in force until now, for the
// history.
func (s *Syncer) past(policy string, prev *policyShares, now time.Duration) pastShares {
	p := pastShares{until: now, def: s.shareOf(prev, false, policy, "")}
	p.lowest = p.def
	if prev != nil && prev.valid {
		p.over = prev.override
		for _, v := range prev.override {
			p.lowest = min(p.lowest, v)
		}
	}
	return p
}

// carryHistory gives next, the shares of policy replacing prev at now,
// the history of prev plus prev itself. A re-read of the same epoch adds
// nothing. Before the first read of the allocations nothing is recorded:
// what was enforced then was the node's own safe start, not the region's.
// Nor is the time before a policy's first allocation (prev nil): every
// region enforced at most its minimum then, and the first allocation
// hands out the budget no region could spend before it. The history holds at most maxShareHistory versions (the oldest two
// merge, coarse) and override maps of at most Config.MaxOverrides
// entries in all (the oldest go coarse).
func (s *Syncer) carryHistory(policy string, next, prev *policyShares, now time.Duration) {
	if prev == nil || !s.allocsRead {
		return
	}
	next.hist = prev.hist
	if prev.epoch == next.epoch && prev.valid == next.valid {
		return
	}
	h := make([]pastShares, 0, len(next.hist)+1)
	h = append(h, next.hist...)
	h = append(h, s.past(policy, prev, now))
	if len(h) > maxShareHistory {
		merged := h[1]
		merged.def, merged.lowest = min(h[0].def, h[1].def), min(h[0].lowest, h[1].lowest)
		merged.over, merged.coarse = nil, true
		h = append([]pastShares{merged}, h[2:]...)
	}
	kept := 0
	for i := len(h) - 1; i >= 0; i-- {
		if kept+len(h[i].over) > s.cfg.MaxOverrides {
			h[i].over, h[i].coarse = nil, true
		}
		kept += len(h[i].over)
	}
	next.hist = h
}

// noteLostLocked records the end of a period without a lease, from
// s.lostSince to now, for LowestShare; call with mu held when the
// published shares come back. The node's first lease (its start) is no
// such period. At most maxShareHistory periods are kept: the oldest two
// merge into one that covers both.
func (s *Syncer) noteLostLocked(now time.Duration) {
	if !s.leased {
		s.leased = true
		return
	}
	spans := append(append([]span(nil), s.lostSpans...), span{from: s.lostSince, to: now})
	if len(spans) > maxShareHistory {
		spans = append([]span{{from: spans[0].from, to: spans[1].to}}, spans[2:]...)
	}
	s.lostSpans = spans
}
