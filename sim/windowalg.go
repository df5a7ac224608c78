package sim

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// limits are the bucket limits of the scenario's policy: a token bucket
// of C and r, or C per Window; the idle TTL covers a full refill (two
// windows), plus a minute.
func (s *Scenario) limits(overcommit float64) bucket.Limits {
	if !s.windowed() {
		return idealLimits(s.Capacity, s.RefillPerSecond, overcommit)
	}
	w := time.Duration(s.Window)
	return bucket.Limits{Algorithm: s.Algorithm, Capacity: s.Capacity, Window: w, IdleTTL: 2*w + time.Minute, Overcommit: overcommit}
}

// Limits are the global limits of the scenario's policy with overcommit
// ε, as the simulator's buckets enforce them (each region at its share):
// what a checker of the bound (internal/boundcheck) checks its runs
// against.
func (s *Scenario) Limits(overcommit float64) bucket.Limits { return s.limits(overcommit) }

// mostAdmitted is the most one global limiter of the scenario's policy
// admits for one subject in an interval of s seconds: C + r·s for a token
// bucket; for a window algorithm C for every aligned window the interval
// touches (⌈s/window⌉ + 1 of them), or for the sliding log C for every
// window length it spans.
func (s *Scenario) mostAdmitted(seconds float64) float64 {
	if !s.windowed() {
		return float64(s.Capacity) + s.RefillPerSecond*seconds
	}
	n := math.Ceil(seconds / time.Duration(s.Window).Seconds())
	if s.Algorithm != bucket.SlidingLog {
		n++
	}
	return float64(s.Capacity) * n
}

// appliedAt is an allocation a region applied at an instant.
type appliedAt struct {
	at time.Duration
	a  *allocation
}

// recordApplied adds a, applied by region r now, to r's history, which
// keeps what the nodes' rules may reach back to: the longest count of the
// window algorithm (two windows), or the token bucket's refill time.
func (e *engine) recordApplied(r int, a *allocation) {
	h := append(e.shareHist[r], appliedAt{at: e.now, a: a})
	e.holdOverrides(r, a, 1)
	keep := e.now - max(2*time.Duration(e.sc.Window), e.refill) - time.Second
	first := 0
	for first+1 < len(h) && h[first+1].at <= keep {
		e.holdOverrides(r, h[first].a, -1)
		first++
	}
	if first > 0 {
		h = append(h[:0], h[first:]...)
	}
	e.shareHist[r] = h
	e.lows[r].valid = false
}

// windowShare is the share region r charges subject j's window count at:
// the lowest it held during the longest time the count can span
// (bucket.Limits.CountedFor), as a regional node does; the current one
// without the rule.
func (e *engine) windowShare(r int, j int32) float64 {
	h := e.shareHist[r]
	cur := h[len(h)-1].a.share(r, j)
	if !e.windowRule {
		return cur
	}
	within, _ := e.prep.Limits().CountedFor(0)
	return e.lowShare(r, j, e.now-within)
}

// lowShares helps find lowestShare for a region's subjects fast. Most
// subjects have no override in any allocation of the region's history:
// their lowest share over a span is the lowest default share, one figure
// for all of them. It changes only when an allocation is applied or the
// span's start passes the next allocation's instant.
type lowShares struct {
	held       []int32 // per subject: allocations of the history with an override of its own
	valid      bool
	from, next time.Duration // def is for the span from from; it holds for starts before next
	def        float64       // the lowest default share over the span
}

// holdOverrides adds d to the count of allocations in region r's history
// that give each of a's subjects an override.
func (e *engine) holdOverrides(r int, a *allocation, d int32) {
	held := e.lows[r].held
	for j := range a.overrides {
		held[j] += d
	}
}

// lowShare is lowestShare(r, j, from).
func (e *engine) lowShare(r int, j int32, from time.Duration) float64 {
	c := &e.lows[r]
	if c.held[j] > 0 {
		return e.lowestShare(r, j, from)
	}
	if !c.valid || from < c.from || from >= c.next {
		e.lowDefault(c, r, from)
	}
	return c.def
}

// lowDefault sets c.def to the lowest default share of region r since
// from, taken in lowestShare's order: the lowest share of a subject that
// holds the default in every allocation of the span.
func (e *engine) lowDefault(c *lowShares, r int, from time.Duration) {
	h := e.shareHist[r]
	c.valid, c.from, c.next, c.def = true, from, maxTime, math.Inf(1)
	first := 0
	for i := len(h) - 1; i >= 0; i-- {
		c.def = math.Min(c.def, h[i].a.def[r])
		if h[i].at <= from {
			first = i
			break
		}
	}
	if first+1 < len(h) {
		c.next = h[first+1].at
	}
}

// lowestShare is the lowest share region r held for subject j from the
// instant from (since the run's start) until now: that of every
// allocation it applied in that time and of the one in force at from
// (regionsync.Syncer.LowestShare).
func (e *engine) lowestShare(r int, j int32, from time.Duration) float64 {
	h := e.shareHist[r]
	low := math.Inf(1)
	for i := len(h) - 1; i >= 0; i-- {
		low = math.Min(low, h[i].a.share(r, j))
		if h[i].at <= from {
			break
		}
	}
	return low
}

// takeWindow decides n unit requests of subject j arriving together in
// m's window-algorithm bucket st at share, one after the other, and
// returns how many it admitted and how many a node reports as pressured
// (denied, or leaving less than half the window's budget f·C).
func (e *engine) takeWindow(m *model, st *bucket.State, share float64, t int64, j int32, n int64) (admitted, pressured int64) {
	if share <= 0 {
		return 0, n
	}
	share = min(share, e.maxShare)
	now := time.UnixMicro(e.nowUs)
	for range n {
		d, err := st.TakeAt(now, &e.prep, share, 1)
		if err != nil {
			e.err = cmp.Or(e.err, fmt.Errorf("sim: bucket decision at %v: %w", e.now, err))
			return admitted, n - admitted
		}
		m.calls++
		if !d.Allowed {
			// A denial leaves the bucket as it was, so every later unit
			// at this instant is denied too.
			pressured += n - admitted
			break
		}
		admitted++
		if d.Remaining < d.Limit/2 {
			pressured++
		}
	}
	if admitted > 0 {
		m.admitted += admitted
		m.win.add(int(j), t, admitted)
		m.aligned.add(int(j), t, admitted)
	}
	return admitted, pressured
}

// alignedWindows counts each subject's admissions per aligned window of
// width ticks and keeps the largest count.
type alignedWindows struct {
	width int64
	index []int64 // per subject: the window its count is of, plus one
	count []int64
	best  int64
}

func newAlignedWindows(subjects int, width int64) *alignedWindows {
	return &alignedWindows{width: max(1, width), index: make([]int64, subjects), count: make([]int64, subjects)}
}

// add records n admissions of subject j at tick t.
func (w *alignedWindows) add(j int, t int64, n int64) {
	if k := t/w.width + 1; w.index[j] != k {
		w.index[j], w.count[j] = k, 0
	}
	w.count[j] += n
	w.best = max(w.best, w.count[j])
}

// worst is the largest overshoot of f over every window measured.
func (f Figures) worst() float64 {
	return max(f.Overshoot1s, f.Overshoot10s, f.Overshoot60s, f.OvershootWindow)
}
