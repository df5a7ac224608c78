package demo

import (
	"math"
	"sort"
	"time"
)

// Figures are the simulator's two measures, taken on a real admitted
// stream of one subject.
type Figures struct {
	// Overshoot maps a window W to max over closed windows [t−W, t] of
	// admitted / (C + r·W) − 1, floored at 0: what no single global bucket
	// could ever have admitted.
	Overshoot map[time.Duration]float64
	// UnderAdmission is 1 − admitted / admitted-by-an-ideal-global-bucket
	// on the same merged request stream (negative when the regions
	// together admitted more than the ideal bucket).
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
// capacity c and refill r per second, for the windows given. Overshoot is
// the largest over subjects; the ideal bucket is one per subject.
//
// The definitions are those of package sim (DESIGN.md "Simulation"); the
// simulator does not export its measuring functions yet, so they are
// restated here over exact arrival times instead of ticks.
func Measure(events []Event, c int64, r float64, windows []time.Duration) Figures {
	f := Figures{Overshoot: make(map[time.Duration]float64, len(windows))}
	bySubject := map[int32][]Event{}
	for _, e := range events {
		bySubject[e.Subject] = append(bySubject[e.Subject], e)
	}
	for _, w := range windows {
		f.Overshoot[w] = 0
	}
	for _, ev := range bySubject {
		var adm []Event
		for _, e := range ev {
			f.Offered += e.Cost
			if e.Admitted {
				f.Admitted += e.Cost
				adm = append(adm, e)
			}
		}
		for _, w := range windows {
			limit := float64(c) + r*w.Seconds()
			best := 0.0
			var sum int64
			lo := 0
			for hi := range adm {
				sum += adm[hi].Cost
				for adm[lo].At < adm[hi].At-w {
					sum -= adm[lo].Cost
					lo++
				}
				if v := float64(sum) / limit; v > best {
					best = v
				}
			}
			f.Overshoot[w] = math.Max(f.Overshoot[w], best-1)
		}
		// The ideal global bucket: full at the start, refilled
		// continuously, deciding every arrival of the merged stream in
		// order.
		tokens := float64(c)
		var last time.Duration
		for _, e := range ev {
			tokens = math.Min(float64(c), tokens+r*(e.At-last).Seconds())
			last = e.At
			if tokens >= float64(e.Cost) {
				tokens -= float64(e.Cost)
				f.Ideal += e.Cost
			}
		}
	}
	if f.Ideal > 0 {
		f.UnderAdmission = 1 - float64(f.Admitted)/float64(f.Ideal)
	}
	return f
}
