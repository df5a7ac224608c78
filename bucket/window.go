package bucket

import "time"

// CountedFor returns how far back from any instant a window algorithm's
// count at that instant may hold cost, plus skew: one window for
// FixedWindow (the aligned window holding the instant began at most one
// window before it) and SlidingLog, two for SlidingWindow (the window
// before the current one is still weighted in). ok is false for
// TokenBucket.
//
// A caller that charges a window's count against the lowest share its
// region held during the last CountedFor, measured on its monotonic clock
// from before it calls the store, keeps regions whose shares move in the
// middle of a window within the window's budget: each region's count is
// at most its share at the window's start times the capacity, and the
// shares summed at any one instant stay within 1 + ε. The span depends on
// no wall-clock reading on purpose: the stores align windows on their
// own clock (Redis TIME), and a caller placing the window's start with
// its own wall clock puts it too late once that clock is stepped back (or
// forward past a window boundary). skew covers the store's clock running
// slow or being stepped back by that much.
func (l Limits) CountedFor(skew time.Duration) (within time.Duration, ok bool) {
	w := l.Window
	if w <= 0 {
		return 0, false
	}
	switch l.Algorithm {
	case FixedWindow, SlidingLog:
		return w + skew, true
	case SlidingWindow:
		return 2*w + skew, true
	default:
		return 0, false
	}
}

// WindowStart is the start of the window of length w holding now, with
// windows aligned to multiples of w since the Unix epoch, as the stores
// align them.
func WindowStart(now time.Time, w time.Duration) time.Time {
	us, wus := now.UnixMicro(), w.Microseconds()
	if wus <= 0 {
		return now
	}
	return time.UnixMicro(us - ((us%wus)+wus)%wus)
}
