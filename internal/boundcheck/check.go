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
	// Node names the node of Region that decided, when a region runs
	// several; it is reported, not checked.
	Node string
	At   time.Time
	// Sent, when set, is the earliest instant the decision can have been
	// made (a client sends a check at Sent and records the answer at At):
	// the decision lies in [Sent, At], widened by Config.Slack. Zero
	// means At.
	Sent time.Time
	Cost int64
	// Share is the share the deciding node said it decided at; it is
	// reported with the decision, not checked.
	Share float64
}

// span returns the earliest and latest instant a decided.
func (a Admission) span(slack time.Duration) (lo, hi time.Time) {
	lo = a.At
	if !a.Sent.IsZero() {
		lo = a.Sent
	}
	return lo.Add(-slack), a.At.Add(slack)
}

// Config says what to check the admissions against.
type Config struct {
	// Limits are the policies' global limits, by name. Admissions of a
	// policy not listed are an error.
	Limits map[string]bucket.Limits
	// Windows are the lengths W token buckets are checked over; default
	// one refill step (1/r), one refill time (C/r) and ten of them. A
	// token bucket's subject is also checked over the whole span of its
	// decisions.
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
	// Shares and SharesAtEnd are the regions' shares at From and at To
	// (Config.Shares), if known.
	Shares, SharesAtEnd map[string]float64
	// Decisions are the admissions inside the window in time order, at
	// most MaxListed of them (the first and the last halves); Unlisted
	// counts the ones left out.
	Decisions []Admission
	Unlisted  int
}

// MaxListed bounds the decisions a Violation lists.
const MaxListed = 64

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s admitted %d in [%s, %s] (%v), bound %.2f:", v.Policy, v.Subject, v.Admitted,
		v.From.Format(time.RFC3339Nano), v.To.Format(time.RFC3339Nano), v.To.Sub(v.From), v.Bound)
	for _, r := range slices.Sorted(maps.Keys(v.ByRegion)) {
		fmt.Fprintf(&b, " %s=%d", r, v.ByRegion[r])
		if s, ok := v.Shares[r]; ok {
			fmt.Fprintf(&b, " (share %.3f", s)
			if e, ok := v.SharesAtEnd[r]; ok && e != s {
				fmt.Fprintf(&b, " -> %.3f", e)
			}
			b.WriteString(")")
		}
	}
	if len(v.Decisions) > 0 {
		b.WriteString("; decisions (offset from the window's start, region/node, share it was decided at, cost):")
	}
	for i, a := range v.Decisions {
		if i == len(v.Decisions)/2 && v.Unlisted > 0 {
			fmt.Fprintf(&b, "\n  ... %d more", v.Unlisted)
		}
		who := a.Region
		if a.Node != "" {
			who += "/" + a.Node
		}
		fmt.Fprintf(&b, "\n  +%v %s share %.3f cost %d", a.At.Sub(v.From).Round(time.Millisecond), who, a.Share, a.Cost)
		if !a.Sent.IsZero() {
			fmt.Fprintf(&b, " (sent +%v)", a.Sent.Sub(v.From).Round(time.Millisecond))
		}
	}
	return b.String()
}

// Report is what Check found.
type Report struct {
	// Decisions and Windows count the admissions and windows checked.
	Decisions int
	Windows   int64
	// Peak is the largest ratio of admitted to bound in any window
	// checked: how close the run came to the bound (over 1: a violation).
	Peak float64
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
		if a.Sent.After(a.At) {
			return Report{}, fmt.Errorf("%w: admission %d sent at %v, after it was recorded at %v", ErrInput, i, a.Sent, a.At)
		}
		k := key{a.Policy, a.Subject}
		groups[k] = append(groups[k], a)
	}
	rep := Report{Decisions: len(adms)}
	for _, k := range slices.SortedFunc(maps.Keys(groups), func(a, b key) int {
		return cmp.Or(strings.Compare(a.policy, b.policy), strings.Compare(a.subject, b.subject))
	}) {
		g := make([]decided, len(groups[k]))
		for i, a := range groups[k] {
			lo, hi := a.span(cfg.Slack)
			g[i] = decided{a, lo, hi}
		}
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

// decided is an admission with the earliest and latest instant it can
// have been decided at.
type decided struct {
	Admission
	lo, hi time.Time
}

// span is one way of cutting a subject's admissions into windows: sliding
// windows of length width ending at each admission's latest instant, or
// windows of length width aligned as the stores align them, each bounded
// by bound; or, with whole, the one window from the earliest decision to
// the latest, bounded by bound plus perSecond for each second of it. A
// decision counts in a window only when all of its possible instants lie
// inside it; openStart leaves the window's first instant out (a sliding
// log forgets an entry exactly one window old).
type span struct {
	width                     time.Duration
	aligned, openStart, whole bool
	bound, perSecond          float64
}

// spans are the windows limits l is checked over.
func spans(l bucket.Limits, cfg Config) []span {
	eps := 1 + l.Overcommit
	c := float64(l.Capacity)
	switch l.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow:
		return []span{{width: l.Window, aligned: true, bound: eps * c}}
	case bucket.SlidingLog:
		return []span{{width: l.Window, openStart: true, bound: eps * c}}
	}
	ws := cfg.Windows
	if len(ws) == 0 && l.RefillPerSecond > 0 {
		step := time.Duration(float64(time.Second) / l.RefillPerSecond)
		full := time.Duration(c / l.RefillPerSecond * float64(time.Second))
		ws = []time.Duration{step, full, 10 * full}
	}
	out := make([]span, 0, len(ws)+1)
	for _, w := range ws {
		out = append(out, span{width: w, bound: eps * (c + l.RefillPerSecond*w.Seconds())})
	}
	return append(out, span{whole: true, bound: eps * c, perSecond: eps * l.RefillPerSecond})
}

// checkSpans checks one subject's admissions g over s; it reorders g.
func checkSpans(rep *Report, g []decided, s span) {
	if s.whole {
		from, to, sum := g[0].lo, g[0].hi, int64(0)
		for _, d := range g {
			from, to = minTime(from, d.lo), maxTime(to, d.hi)
			sum += d.Cost
		}
		bound := s.bound + s.perSecond*to.Sub(from).Seconds()
		rep.window(sum, bound)
		if float64(sum) > bound+1e-9 {
			rep.add(g[0].Policy, g[0].Subject, from, to, sum, bound, g)
		}
		return
	}
	if s.aligned {
		// Each decision can lie wholly inside at most one aligned window:
		// the one holding its earliest instant.
		slices.SortStableFunc(g, func(a, b decided) int { return a.lo.Compare(b.lo) })
		for i := 0; i < len(g); {
			start := bucket.WindowStart(g[i].lo, s.width)
			end := start.Add(s.width)
			j, sum := i, int64(0)
			var in []decided
			for ; j < len(g) && g[j].lo.Before(end); j++ {
				if g[j].hi.Before(end) {
					sum += g[j].Cost
					in = append(in, g[j])
				}
			}
			rep.window(sum, s.bound)
			if float64(sum) > s.bound+1e-9 {
				rep.add(g[i].Policy, g[i].Subject, start, end, sum, s.bound, in)
			}
			i = j
		}
		return
	}
	// Windows [b-width, b] for b each decision's latest instant: a
	// decision counts when its earliest instant is inside too.
	slices.SortStableFunc(g, func(a, b decided) int { return a.hi.Compare(b.hi) })
	first := 0
	for i := range g {
		b := g[i].hi
		from := b.Add(-s.width)
		for g[first].hi.Before(from) {
			first++
		}
		sum := int64(0)
		for _, d := range g[first : i+1] {
			if inside(d.lo, from, s.openStart) {
				sum += d.Cost
			}
		}
		rep.window(sum, s.bound)
		if float64(sum) > s.bound+1e-9 {
			var in []decided
			for _, d := range g[first : i+1] {
				if inside(d.lo, from, s.openStart) {
					in = append(in, d)
				}
			}
			rep.add(g[i].Policy, g[i].Subject, from, b, sum, s.bound, in)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// inside reports whether t is at or after from (after, with open).
func inside(t, from time.Time, open bool) bool {
	if open {
		return t.After(from)
	}
	return !t.Before(from)
}

// window counts a window checked that admitted sum against bound.
func (rep *Report) window(sum int64, bound float64) {
	rep.Windows++
	if bound > 0 {
		rep.Peak = max(rep.Peak, float64(sum)/bound)
	}
}

// add records a violation; of the overlapping windows of one subject
// only the worst is kept.
func (rep *Report) add(policy, subject string, from, to time.Time, admitted int64, bound float64, in []decided) {
	v := Violation{Policy: policy, Subject: subject, From: from, To: to, Admitted: admitted, Bound: bound, ByRegion: map[string]int64{}}
	for _, d := range in {
		v.ByRegion[d.Region] += d.Cost
	}
	if n := len(rep.Violations); n > 0 {
		last := &rep.Violations[n-1]
		if last.Policy == policy && last.Subject == subject && !from.After(last.To) {
			if float64(admitted)/bound > float64(last.Admitted)/last.Bound {
				*last = v.withDecisions(in)
			}
			return
		}
	}
	if len(rep.Violations) < 4*MaxViolations {
		rep.Violations = append(rep.Violations, v.withDecisions(in))
	}
}

// withDecisions lists in (the first and the last MaxListed/2 when there
// are more) on v, in time order.
func (v Violation) withDecisions(in []decided) Violation {
	list := make([]Admission, 0, min(len(in), MaxListed))
	for i, d := range in {
		if len(in) <= MaxListed || i < MaxListed/2 || i >= len(in)-MaxListed/2 {
			list = append(list, d.Admission)
		}
	}
	slices.SortStableFunc(list, func(a, b Admission) int { return a.At.Compare(b.At) })
	v.Decisions, v.Unlisted = list, len(in)-len(list)
	return v
}

func fillShares(v *Violation, cfg Config) {
	if cfg.Shares == nil {
		return
	}
	v.Shares, v.SharesAtEnd = map[string]float64{}, map[string]float64{}
	for r := range v.ByRegion {
		v.Shares[r] = cfg.Shares(v.Policy, r, v.From)
		v.SharesAtEnd[r] = cfg.Shares(v.Policy, r, v.To)
	}
}
