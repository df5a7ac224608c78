package regionsync

import (
	"context"
	"time"
)

// LeaseGate reports the leases a region handed out of its shares
// (internal/rlqs): a node acknowledges a shrink only once every lease
// taken above the new share has ended, the two-step protocol one level
// down.
type LeaseGate interface {
	// HeldAbove returns when the last lease of policy taken above the
	// share that share(subject) reports ends, on Config.Clock's wall
	// reading; zero (or a past instant) when none is.
	HeldAbove(policy string, share func(subject string) float64) time.Time
}

// leasePoll is how often a postponed acknowledgement looks again.
const leasePoll = 20 * time.Millisecond

// leasesEnded waits until no lease is held above a share of t. It returns
// false when ctx ends or a newer table is published first (the caller
// starts over with that one).
func (s *Syncer) leasesEnded(ctx context.Context, t *table) bool {
	if s.cfg.Leases == nil {
		return true
	}
	logged := false
	for {
		var until time.Time
		for _, epochs := range t.shares.epochs {
			for p := range epochs {
				u := s.cfg.Leases.HeldAbove(p, func(subject string) float64 { return s.shareIn(t, p, subject) })
				if u.After(until) {
					until = u
				}
			}
		}
		wait := until.Sub(s.now())
		if wait <= 0 {
			return true
		}
		if !logged {
			s.log.Info("acknowledgement postponed until the leases above the new shares end", "wait", wait)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(wait, leasePoll)):
		}
		if s.tab.Load() != t {
			return false
		}
	}
}
