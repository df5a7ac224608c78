package demo

import (
	"fmt"
	"sort"
	"time"

	"github.com/quotacoord/quota/sim"
)

// Figures are the simulator's two measures, taken on a real admitted
// stream.
type Figures struct {
	// Overshoot maps a window W to max over subjects and closed windows
	// [t−W, t] of admitted / (C + r·W) − 1, floored at 0: what no single
	// global bucket could ever have admitted.
	Overshoot map[time.Duration]float64
	// UnderAdmission is 1 − admitted / admitted-by-an-ideal-global-bucket
	// on the same merged request stream, floored at 0.
	UnderAdmission float64
	// Offered, Admitted and Ideal are the costs of the stream.
	Offered, Admitted, Ideal int64
}

// OvershootWindows are the windows the summary reports.
var OvershootWindows = []time.Duration{time.Second, 10 * time.Second, 60 * time.Second}

func sortEvents(ev []Event) {
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At < ev[j].At })
}

// Measure computes Figures over events (sorted by At) for a policy of
// capacity c and refill r per second per subject, for the windows given,
// with package sim's own code: sim.Measure for overshoot on the exact
// admission instants, and sim.IdealBucket (one global bucket per subject,
// full at offset 0) deciding the merged stream for under-admission. The
// simulator's figures and the live run's are thus measured alike.
func Measure(events []Event, c int64, r float64, windows []time.Duration) (Figures, error) {
	f := Figures{Overshoot: make(map[time.Duration]float64, len(windows))}
	ideal, err := sim.NewIdealBucket(c, r)
	if err != nil {
		return f, fmt.Errorf("demo: measure: %w", err)
	}
	adm := make([]sim.Admission, 0, len(events))
	for _, e := range events {
		f.Offered += e.Cost
		if e.Admitted {
			f.Admitted += e.Cost
			adm = append(adm, sim.Admission{At: e.At, Subject: int(e.Subject), Count: e.Cost})
		}
		if _, err := ideal.Take(e.At, int(e.Subject), e.Cost); err != nil {
			return f, fmt.Errorf("demo: measure: %w", err)
		}
	}
	f.Ideal = ideal.Admitted()
	f.UnderAdmission = sim.UnderAdmission(f.Admitted, f.Ideal)
	if len(adm) == 0 {
		for _, w := range windows {
			f.Overshoot[w] = 0
		}
		return f, nil
	}
	m, err := sim.Measure(adm, float64(c), r, windows)
	if err != nil {
		return f, fmt.Errorf("demo: measure: %w", err)
	}
	for k, w := range m.Windows {
		f.Overshoot[w] = m.Overshoot[k]
	}
	return f, nil
}
