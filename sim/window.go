package sim

// Windows over which overshoot is measured.
var windowSeconds = [3]float64{1, 10, 60}

// entry is one tick at which a subject had admissions.
type entry struct {
	tick      int64
	cumBefore int64 // admitted before this tick
}

// subjectWindows tracks one subject's admissions for sliding windows.
type subjectWindows struct {
	entries []entry
	head    int
	ptr     [3]int // first entry inside each window
	cum     int64
}

// windows measures overshoot(W) = max over closed windows [t−W, t] of
// admitted / (C + r·W) − 1 for every subject, at tick resolution.
type windows struct {
	subj     []subjectWindows
	wTicks   [3]int64
	limit    [3]float64 // C + r·W
	maxRatio [3]float64
}

func newWindows(subjects int, tickSeconds float64, capacity int64, refill float64) *windows {
	w := &windows{subj: make([]subjectWindows, subjects)}
	for k, s := range windowSeconds {
		w.wTicks[k] = int64(s/tickSeconds + 0.5)
		w.limit[k] = float64(capacity) + refill*s
	}
	return w
}

// add records n admissions of subject j at tick t (t never decreases).
func (w *windows) add(j int, t int64, n int64) {
	s := &w.subj[j]
	if l := len(s.entries); l > s.head && s.entries[l-1].tick == t {
		s.cum += n
	} else {
		s.entries = append(s.entries, entry{tick: t, cumBefore: s.cum})
		s.cum += n
	}
	for k := range w.wTicks {
		from := t - w.wTicks[k]
		p := max(s.ptr[k], s.head)
		for s.entries[p].tick < from {
			p++
		}
		s.ptr[k] = p
		if r := float64(s.cum-s.entries[p].cumBefore) / w.limit[k]; r > w.maxRatio[k] {
			w.maxRatio[k] = r
		}
	}
	// The longest window's pointer marks what is still needed.
	s.head = s.ptr[len(s.ptr)-1]
	if s.head > 64 && s.head*2 > len(s.entries) {
		n := copy(s.entries, s.entries[s.head:])
		s.entries = s.entries[:n]
		for k := range s.ptr {
			s.ptr[k] -= s.head
		}
		s.head = 0
	}
}

// overshoot returns the three figures, floored at 0.
func (w *windows) overshoot() [3]float64 {
	var o [3]float64
	for k, r := range w.maxRatio {
		o[k] = max(0, r-1)
	}
	return o
}
