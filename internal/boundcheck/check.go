package boundcheck

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// Admission is one admitted decision: Cost units of Policy for Subject,
// admitted by a node of Region, recorded at At.
type Admission struct {
	Policy, Subject, Region string
	At                      time.Time
	Cost                    int64
}

// Config says what to check the admissions against.
type Config struct {
	// Limits are the policies' global limits, by name. Admissions of a
	// policy not listed are an error.
	Limits map[string]bucket.Limits
	// Windows are the lengths W token buckets are checked over; default
	// one refill time (C/r) and ten of them.
	Windows []time.Duration
	// Slack is how far a recorded instant may be from the decision's.
	Slack time.Duration
	// Shares, when set, gives the share a region held for a policy at an
	// instant, for the report of a violation.
	Shares func(policy, region string, at time.Time) float64
}

// Violation is a window whose admissions exceed the bound.
type Violation struct {
	Policy, Subject string
	From, To        time.Time
	Admitted        int64
	Bound           float64
	// ByRegion is what each region admitted inside the window.
	ByRegion map[string]int64
	// Shares are the regions' shares at From (Config.Shares), if known.
	Shares map[string]float64
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s admitted %d in [%s, %s] (%v), bound %.2f:", v.Policy, v.Subject, v.Admitted,
		v.From.Format(time.RFC3339Nano), v.To.Format(time.RFC3339Nano), v.To.Sub(v.From), v.Bound)
	for _, r := range slices.Sorted(maps.Keys(v.ByRegion)) {
		fmt.Fprintf(&b, " %s=%d", r, v.ByRegion[r])
		if s, ok := v.Shares[r]; ok {
			fmt.Fprintf(&b, " (share %.3f)", s)
		}
	}
	return b.String()
}

// Report is what Check found.
type Report struct {
	// Decisions and Windows count the admissions and windows checked.
	Decisions int
	Windows   int64
	// Violations are at most MaxViolations windows over the bound, the
	// worst (largest admitted over bound) first.
	Violations []Violation
}

// MaxViolations bounds the violations a Report holds.
const MaxViolations = 20

// ErrInput is wrapped by every error about Check's input.
var ErrInput = errors.New("boundcheck: invalid input")

// Check checks adms against the bound (see the package doc).
func Check(cfg Config, adms []Admission) (Report, error) {
	if cfg.Slack < 0 {
		return Report{}, fmt.Errorf("%w: slack %v", ErrInput, cfg.Slack)
	}
	type key struct{ policy, subject string }
	groups := map[key][]Admission{}
	for i, a := range adms {
		if _, ok := cfg.Limits[a.Policy]; !ok {
			return Report{}, fmt.Errorf("%w: admission %d of unknown policy %q", ErrInput, i, a.Policy)
		}
		if a.Cost <= 0 {
			return Report{}, fmt.Errorf("%w: admission %d has cost %d", ErrInput, i, a.Cost)
		}
		k := key{a.Policy, a.Subject}
		groups[k] = append(groups[k], a)
	}
	rep := Report{Decisions: len(adms)}
	for _, k := range slices.SortedFunc(maps.Keys(groups), func(a, b key) int {
		return cmp.Or(strings.Compare(a.policy, b.policy), strings.Compare(a.subject, b.subject))
	}) {
		g := groups[k]
		slices.SortStableFunc(g, func(a, b Admission) int { return a.At.Compare(b.At) })
		l := cfg.Limits[k.policy]
		for _, s := range spans(l, cfg) {
			checkSpans(&rep, g, s)
		}
	}
	slices.SortStableFunc(rep.Violations, func(a, b Violation) int {
		return cmp.Compare(float64(b.Admitted)/b.Bound, float64(a.Admitted)/a.Bound)
	})
	if len(rep.Violations) > MaxViolations {
		rep.Violations = rep.Violations[:MaxViolations]
	}
	for i := range rep.Violations {
		fillShares(&rep.Violations[i], cfg)
	}
	return rep, nil
}

// span is one way of cutting a subject's admissions into windows: sliding
// windows of length width ending at each admission, or aligned windows of
// length width (each narrowed by inset at both ends), each bounded by
// bound.
type span struct {
	width, inset time.Duration
	aligned      bool
	bound        float64
}

// spans are the windows limits l is checked over.
func spans(l bucket.Limits, cfg Config) []span {
	eps := 1 + l.Overcommit
	c := float64(l.Capacity)
	switch l.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow:
		return []span{{width: l.Window, inset: cfg.Slack, aligned: true, bound: eps * c}}
	case bucket.SlidingLog:
		return []span{{width: max(0, l.Window-2*cfg.Slack), bound: eps * c}}
	}
	ws := cfg.Windows
	if len(ws) == 0 && l.RefillPerSecond > 0 {
		full := time.Duration(c / l.RefillPerSecond * float64(time.Second))
		ws = []time.Duration{full, 10 * full}
	}
	out := make([]span, 0, len(ws))
	for _, w := range ws {
		widened := w + 2*cfg.Slack
		out = append(out, span{width: w, bound: eps * (c + l.RefillPerSecond*widened.Seconds())})
	}
	return out
}

// checkSpans checks one subject's admissions g (in time order) over s.
func checkSpans(rep *Report, g []Admission, s span) {
	if s.aligned {
		w := s.width
		for i := 0; i < len(g); {
			start := bucket.WindowStart(g[i].At, w)
			from, to := start.Add(s.inset), start.Add(w-s.inset)
			j, sum := i, int64(0)
			var in []Admission
			for ; j < len(g) && g[j].At.Before(start.Add(w)); j++ {
				if !g[j].At.Before(from) && !g[j].At.After(to) {
					sum += g[j].Cost
					in = append(in, g[j])
				}
			}
			rep.Windows++
			if float64(sum) > s.bound+1e-9 {
				rep.add(g[i].Policy, g[i].Subject, from, to, sum, s.bound, in)
			}
			i = j
		}
		return
	}
	first, sum := 0, int64(0)
	for i := range g {
		sum += g[i].Cost
		for g[first].At.Before(g[i].At.Add(-s.width)) {
			sum -= g[first].Cost
			first++
		}
		rep.Windows++
		if float64(sum) > s.bound+1e-9 {
			rep.add(g[i].Policy, g[i].Subject, g[i].At.Add(-s.width), g[i].At, sum, s.bound, g[first:i+1])
		}
	}
}

// add records a violation; of the overlapping windows of one subject
// only the worst is kept.
func (rep *Report) add(policy, subject string, from, to time.Time, admitted int64, bound float64, in []Admission) {
	v := Violation{Policy: policy, Subject: subject, From: from, To: to, Admitted: admitted, Bound: bound, ByRegion: map[string]int64{}}
	for _, a := range in {
		v.ByRegion[a.Region] += a.Cost
	}
	if n := len(rep.Violations); n > 0 {
		last := &rep.Violations[n-1]
		if last.Policy == policy && last.Subject == subject && !from.After(last.To) {
			if float64(admitted)/bound > float64(last.Admitted)/last.Bound {
				*last = v
			}
			return
		}
	}
	if len(rep.Violations) < 4*MaxViolations {
		rep.Violations = append(rep.Violations, v)
	}
}

func fillShares(v *Violation, cfg Config) {
	if cfg.Shares == nil {
		return
	}
	v.Shares = map[string]float64{}
	for r := range v.ByRegion {
		v.Shares[r] = cfg.Shares(v.Policy, r, v.From)
	}
}
