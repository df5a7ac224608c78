package sim

// Windows over which the simulator measures overshoot, in seconds.
var windowSeconds = [3]float64{1, 10, 60}

// maxTrackWindows is the most window lengths one tracker follows (Measure
// runs several trackers for more).
const maxTrackWindows = 4

// mark is one instant at which a subject had admissions.
type mark struct {
	at        int64 // in the tracker's time unit (ticks, or nanoseconds)
	cumBefore int64 // admitted before this instant
}

// subjectWindows is one subject's admissions still inside the longest
// window, with its window pointers inline (one cache line).
type subjectWindows struct {
	marks   []mark // oldest first; marks[:head] are dead
	cum     int64  // admitted so far
	headCum int64  // marks[head].cumBefore: cum − headCum bounds every window's count
	head    int32
	ptr     [maxTrackWindows]int32 // per window: first mark possibly inside it
}

// windows finds, for every subject and each window length W, the largest
// admitted count over closed windows [t−W, t], t an admission instant (a
// closed window of length W holds the most when it ends at an admission).
// It is the one implementation behind the simulator's figures and Measure.
//
// Cost per add: amortised O(1), and usually O(1) without reading old marks:
// cum − headCum (everything since the first mark the longest window may
// still hold) bounds every window's count, so while it cannot beat the
// best count of any window nothing is counted. Otherwise the longest
// window is counted first (its count bounds the shorter ones') and the
// dead marks are dropped. Memory: the marks since head, per subject.
type windows struct {
	subj    []subjectWindows
	width   []int64   // window lengths in the time unit
	limit   []float64 // C + r·W
	best    []int64   // largest count seen per window
	minBest int64     // min(best)
	longest int       // index of the longest window
}

// newWindows tracks up to maxTrackWindows windows for subjects.
func newWindows(subjects int, widths []int64, limits []float64) *windows {
	w := &windows{subj: make([]subjectWindows, subjects), width: widths, limit: limits, best: make([]int64, len(widths))}
	for i, v := range widths {
		if v > widths[w.longest] {
			w.longest = i
		}
	}
	return w
}

// count returns s's admissions in [t−width[k], t] and advances the
// window's pointer.
func (w *windows) count(s *subjectWindows, k int, t int64) int64 {
	p := max(s.ptr[k], s.head)
	from := t - w.width[k]
	for s.marks[p].at < from {
		p++
	}
	s.ptr[k] = p
	return s.cum - s.marks[p].cumBefore
}

// add records n > 0 admissions of subject j at t (t never decreases per
// subject).
func (w *windows) add(j int, t int64, n int64) {
	s := &w.subj[j]
	if l := int32(len(s.marks)); l == s.head || s.marks[l-1].at != t {
		s.marks = append(s.marks, mark{at: t, cumBefore: s.cum})
	}
	s.cum += n
	if s.cum-s.headCum <= w.minBest && int32(len(s.marks))-s.head < 64 {
		return
	}
	c := w.count(s, w.longest, t)
	raised := false
	for k := range w.best {
		ck := c
		if k != w.longest {
			if c <= w.best[k] {
				continue
			}
			ck = w.count(s, k, t)
		}
		if ck > w.best[k] {
			w.best[k], raised = ck, true
		}
	}
	if raised {
		w.minBest = w.best[0]
		for _, b := range w.best {
			w.minBest = min(w.minBest, b)
		}
	}
	// The longest window's pointer marks what is still needed.
	s.head = s.ptr[w.longest]
	if s.head > 32 && int(s.head)*2 > len(s.marks) {
		n := int32(copy(s.marks, s.marks[s.head:]))
		s.marks = s.marks[:n]
		for k := range s.ptr {
			s.ptr[k] = max(0, s.ptr[k]-s.head)
		}
		s.head = 0
	}
	s.headCum = s.marks[s.head].cumBefore
}

// overshoot returns best/limit − 1 per window, floored at 0.
func (w *windows) overshoot() []float64 {
	o := make([]float64, len(w.best))
	for k, b := range w.best {
		o[k] = max(0, float64(b)/w.limit[k]-1)
	}
	return o
}
