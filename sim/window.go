package sim

// Windows over which the simulator measures overshoot, in seconds.
var windowSeconds = [3]float64{1, 10, 60}

// mark is one admission in a tracker's time-ordered queue.
type mark struct {
	at      int64 // in the tracker's time unit (ticks, or nanoseconds)
	n       int64
	subject int32
}

// windows finds, for every subject and each window length W, the largest
// admitted count over closed windows [t−W, t], t an admission instant (a
// closed window of length W holds the most when it ends at an admission).
// It is the one implementation behind the simulator's figures and Measure.
//
// Admissions enter one queue in time order (across subjects). Per window
// there is a running count per subject (a prefix sum over the queue minus
// what has left the window) and a pointer to the first queued admission
// still inside it; moving time forward subtracts what leaves. Cost per
// admission: O(windows), touching the queue's end, its pointers (both
// sequential) and a subject's counters, one per window, side by side (one
// cache line for the three windows of the simulator: a subject's counters
// take a power of two of words, so that they never straddle two lines).
// Memory: the admissions within the longest window, plus the counters.
type windows struct {
	width  []int64   // window lengths in the time unit
	limit  []float64 // C + r·W
	best   []int64   // largest count seen per window
	count  []int64   // [subject·stride + window]: admitted inside the window
	stride int       // words per subject in count: len(width) up to a power of two
	queue  []mark    // time order; queue[:head] have left every window
	ptr    []int     // per window: first queue index inside it
	head   int
	last   int64
}

func newWindows(subjects int, widths []int64, limits []float64) *windows {
	stride := 1
	for stride < len(widths) {
		stride *= 2
	}
	return &windows{width: widths, limit: limits, best: make([]int64, len(widths)),
		count: make([]int64, subjects*stride), stride: stride, ptr: make([]int, len(widths))}
}

// counted returns subject j's count in the shortest window (engine.warm
// reads it ahead of an add).
func (w *windows) counted(j int32) int64 { return w.count[int(j)*w.stride] }

// add records n > 0 admissions of subject j at t; t never decreases.
func (w *windows) add(j int, t int64, n int64) {
	if t != w.last || len(w.queue) == w.head {
		w.advance(t)
	}
	w.queue = append(w.queue, mark{at: t, n: n, subject: int32(j)})
	kn := len(w.best)
	c := w.count[j*w.stride : j*w.stride+kn]
	for k := range c {
		v := c[k] + n
		c[k] = v
		if v > w.best[k] {
			w.best[k] = v
		}
	}
}

// advance moves every window to end at t: admissions before t−W leave it.
func (w *windows) advance(t int64) {
	w.last = t
	head := len(w.queue)
	for k := range w.width {
		p, from := w.ptr[k], t-w.width[k]
		for ; p < len(w.queue) && w.queue[p].at < from; p++ {
			w.count[int(w.queue[p].subject)*w.stride+k] -= w.queue[p].n
		}
		w.ptr[k] = p
		head = min(head, p)
	}
	w.head = head
	if head > 1024 && head*2 > len(w.queue) {
		n := copy(w.queue, w.queue[head:])
		w.queue = w.queue[:n]
		for k := range w.ptr {
			w.ptr[k] -= head
		}
		w.head = 0
	}
}

// overshoot returns best/limit − 1 per window, floored at 0.
func (w *windows) overshoot() []float64 {
	o := make([]float64, len(w.best))
	for k, b := range w.best {
		o[k] = max(0, float64(b)/w.limit[k]-1)
	}
	return o
}

// merged returns a model with the admitted counts and window maxima of m
// and o, which decided disjoint sets of subjects of one stream (figures
// only: it holds no buckets or counters).
func (m *model) merged(o *model) *model {
	w := &windows{width: m.win.width, limit: m.win.limit, best: make([]int64, len(m.win.best))}
	for k := range w.best {
		w.best[k] = max(m.win.best[k], o.win.best[k])
	}
	out := &model{win: w, admitted: m.admitted + o.admitted, calls: m.calls + o.calls}
	if m.aligned != nil && o.aligned != nil {
		out.aligned = &alignedWindows{best: max(m.aligned.best, o.aligned.best)}
	}
	return out
}
