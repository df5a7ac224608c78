package sim

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// Admission is Count requests of Subject admitted at At (time since any
// fixed origin), as a live system's log or a simulator run records them.
type Admission struct {
	At      time.Duration
	Subject int
	Count   int64
}

// Measured is what Measure finds in a list of admissions.
type Measured struct {
	// Windows are the window lengths W, as given.
	Windows []time.Duration
	// Overshoot[k] is overshoot(Windows[k]): the largest, over subjects and
	// closed windows [t−W, t], of admitted/(C + r·W) − 1, floored at 0.
	// 0 means no single global bucket per subject would have admitted less.
	Overshoot []float64
	// Admitted is the sum of the Counts.
	Admitted int64
}

// MaxMeasureWindows bounds the windows Measure accepts.
const MaxMeasureWindows = 64

// ErrMeasure is wrapped by every error about Measure's input.
var ErrMeasure = errors.New("sim: invalid measure input")

// Measure computes overshoot(W) for each window length W on exact
// timestamps, with the code behind the simulator's figures (which use tick
// instants): per subject, whose global budget is capacity C plus refill r
// per second, the largest count admitted within any closed window of
// length W, divided by C + r·W, minus 1, floored at 0; the maximum over
// subjects. admitted need not be sorted and is not modified. Cost:
// O(n log n) time and O(n) memory for n admissions.
func Measure(admitted []Admission, capacity, refillPerSecond float64, windows []time.Duration) (Measured, error) {
	switch {
	case !(capacity > 0) || math.IsInf(capacity, 0):
		return Measured{}, fmt.Errorf("%w: capacity %v, want > 0", ErrMeasure, capacity)
	case !(refillPerSecond >= 0) || math.IsInf(refillPerSecond, 0):
		return Measured{}, fmt.Errorf("%w: refill %v per second, want ≥ 0", ErrMeasure, refillPerSecond)
	case len(windows) == 0 || len(windows) > MaxMeasureWindows:
		return Measured{}, fmt.Errorf("%w: %d windows, want 1 to %d", ErrMeasure, len(windows), MaxMeasureWindows)
	}
	widths := make([]int64, len(windows))
	limits := make([]float64, len(windows))
	for k, w := range windows {
		if w <= 0 {
			return Measured{}, fmt.Errorf("%w: window %v, want > 0", ErrMeasure, w)
		}
		widths[k] = int64(w)
		limits[k] = capacity + refillPerSecond*w.Seconds()
	}
	idx := make([]int32, len(admitted))
	for i := range idx {
		idx[i] = int32(i)
	}
	sort.SliceStable(idx, func(a, b int) bool { return admitted[idx[a]].At < admitted[idx[b]].At })
	dense := map[int]int{}
	var total int64
	for i, a := range admitted {
		if a.Count < 0 {
			return Measured{}, fmt.Errorf("%w: admission %d has count %d", ErrMeasure, i, a.Count)
		}
		if _, ok := dense[a.Subject]; !ok {
			dense[a.Subject] = len(dense)
		}
		total += a.Count
	}
	w := newWindows(len(dense), widths, limits)
	for _, i := range idx {
		if a := admitted[i]; a.Count > 0 {
			w.add(dense[a.Subject], int64(a.At), a.Count)
		}
	}
	return Measured{Windows: append([]time.Duration(nil), windows...), Overshoot: w.overshoot(), Admitted: total}, nil
}

// UnderAdmission returns 1 − admitted/idealAdmitted, floored at 0: the part
// of what an ideal global bucket admits on the same stream that the system
// denied. It is 0 when idealAdmitted ≤ 0.
func UnderAdmission(admitted, idealAdmitted int64) float64 {
	if idealAdmitted <= 0 {
		return 0
	}
	return math.Max(0, 1-float64(admitted)/float64(idealAdmitted))
}

// IdealBucket is the simulator's ideal global bucket for streams that do not
// come from the simulator (a live run's requests at their real instants):
// one bucket per subject with the whole budget (share 1), deciding batches
// with the same code as the simulator's ideal baseline. Not safe for
// concurrent use; the zero IdealBucket is not usable (use NewIdealBucket).
type IdealBucket struct {
	prep     bucket.Prepared
	states   map[int]*bucket.TokenState
	admitted int64
	last     time.Duration
}

// MaxIdealSubjects bounds the distinct subjects of an IdealBucket.
const MaxIdealSubjects = MaxSubjects

// NewIdealBucket returns an ideal bucket of capacity C and refill r per
// second per subject.
func NewIdealBucket(capacity int64, refillPerSecond float64) (*IdealBucket, error) {
	if !(refillPerSecond > 0) || math.IsInf(refillPerSecond, 0) {
		return nil, fmt.Errorf("sim: ideal bucket: refill %v per second, want > 0", refillPerSecond)
	}
	p, err := bucket.Prepare(idealLimits(capacity, refillPerSecond, 0))
	if err != nil {
		return nil, fmt.Errorf("sim: ideal bucket: %w", err)
	}
	return &IdealBucket{prep: p, states: map[int]*bucket.TokenState{}}, nil
}

// idealLimits are the simulator's bucket limits for C, r and ε: an idle
// TTL past a full refill, so no bucket expires while it refills.
func idealLimits(capacity int64, refill, overcommit float64) bucket.Limits {
	return bucket.Limits{Capacity: capacity, RefillPerSecond: refill,
		IdleTTL:    time.Duration(float64(time.Second)*float64(capacity)/refill) + time.Minute,
		Overcommit: overcommit}
}

// Take decides count unit requests of subject arriving together at at
// (time since any fixed origin, never decreasing) and returns how many the
// ideal bucket admits.
func (b *IdealBucket) Take(at time.Duration, subject int, count int64) (int64, error) {
	if at < b.last {
		return 0, fmt.Errorf("sim: ideal bucket: time %v before %v", at, b.last)
	}
	if count < 0 {
		return 0, fmt.Errorf("sim: ideal bucket: count %d", count)
	}
	b.last = at
	st := b.states[subject]
	if st == nil {
		if len(b.states) >= MaxIdealSubjects {
			return 0, fmt.Errorf("sim: ideal bucket: more than %d subjects", MaxIdealSubjects)
		}
		st = new(bucket.TokenState)
		b.states[subject] = st
	}
	a, err := st.TakeUnitsAt(time.Unix(0, 0).Add(at), &b.prep, 1, count)
	if err != nil {
		return 0, fmt.Errorf("sim: ideal bucket: %w", err)
	}
	b.admitted += a
	return a, nil
}

// Admitted returns the total admitted so far.
func (b *IdealBucket) Admitted() int64 { return b.admitted }

// IdealAdmitted returns what the ideal global bucket admits on cfg's
// request stream (Arrivals): the IdealAdmitted a Run of cfg reports, for
// every scenario without retries (a retry scenario's figure here is for
// the fresh stream alone).
func IdealAdmitted(cfg Config) (int64, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return 0, err
	}
	cfg.NoBaselines = false
	res, err := run(cfg, nil, nil, false)
	if err != nil {
		return 0, err
	}
	return res.IdealAdmitted, nil
}
