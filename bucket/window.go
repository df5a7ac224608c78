package bucket

import "time"

// CountedSince returns the instant from which a window algorithm's count
// at now may still hold cost: the start of now's aligned window
// (FixedWindow), of the window before it, whose count is still weighted
// in (SlidingWindow), or now − Window (SlidingLog); skew widens the span
// for a store whose clock (Redis TIME, which aligns the windows) may run
// behind the caller's. ok is false for TokenBucket.
//
// A caller that charges a window's count against the lowest share its
// region held since that instant keeps regions whose shares move in the
// middle of a window within the window's budget: each region's count is
// at most its share at the window's start times the capacity, and the
// shares summed at any one instant stay within 1 + ε.
func (l Limits) CountedSince(now time.Time, skew time.Duration) (since time.Time, ok bool) {
	w := l.Window
	if w <= 0 {
		return time.Time{}, false
	}
	switch l.Algorithm {
	case FixedWindow:
		since = WindowStart(now, w)
	case SlidingWindow:
		since = WindowStart(now, w).Add(-w)
	case SlidingLog:
		since = now.Add(-w)
	default:
		return time.Time{}, false
	}
	return since.Add(-skew), true
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
