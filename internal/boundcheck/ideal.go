package boundcheck

import (
	"math"
	"slices"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// IdealAdmitted returns how many of the unit-cost offers one token bucket
// of limits l, full at the first offer, admits when it sees them all in
// time order: what one ideal global limiter would have admitted. A run's
// under-admission is 1 − admitted/IdealAdmitted. offers is not modified.
func IdealAdmitted(offers []time.Time, l bucket.Limits) int {
	if len(offers) == 0 {
		return 0
	}
	sorted := slices.Clone(offers)
	slices.SortFunc(sorted, func(a, b time.Time) int { return a.Compare(b) })
	tokens, last, n := float64(l.Capacity), sorted[0], 0
	for _, at := range sorted {
		tokens = math.Min(float64(l.Capacity), tokens+l.RefillPerSecond*at.Sub(last).Seconds())
		last = at
		if tokens >= 1 {
			tokens--
			n++
		}
	}
	return n
}
