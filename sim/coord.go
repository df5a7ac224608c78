package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/quotacoord/quota/allocator"
)

// handle runs one control-plane event.
func (e *engine) handle(ev *event) error {
	switch ev.kind {
	case evReport:
		e.push(&event{at: ev.at + e.cfg.ReportInterval, kind: evReport, region: ev.region})
		rep := e.collect(ev.region)
		if !e.up[ev.region] || e.rng.Float64() < e.cfg.LostReports {
			return nil
		}
		at := ev.at + e.delay()
		if e.rng.Float64() < e.cfg.LateReports {
			at += e.cfg.ReportInterval
		}
		e.push(&event{at: at, kind: evReportArrive, region: ev.region, rep: rep})
	case evReportArrive:
		e.absorb(ev.region, ev.rep)
	case evRebalance:
		e.push(&event{at: ev.at + e.cfg.RebalanceInterval, kind: evRebalance})
		if e.coordUp {
			return e.rebalance()
		}
	case evApply:
		if e.up[ev.region] && ev.alloc.epoch > e.applied[ev.region].epoch {
			e.setApplied(ev.region, ev.alloc)
			e.checkSum()
			e.push(&event{at: ev.at + e.delay(), kind: evAck, region: ev.region, alloc: ev.alloc})
		}
	case evAck:
		if ev.alloc.epoch > e.acked[ev.region] {
			e.acked[ev.region] = ev.alloc.epoch
		}
		if e.coordUp {
			e.maybeGrow()
		}
	case evScenario:
		r := ev.sc.Region
		switch ev.sc.Kind {
		case EventRegionDown:
			if e.up[r] {
				e.up[r], e.downAt[r] = false, ev.at
				e.checkSum()
			}
		case EventRegionUp:
			if !e.up[r] {
				// Back at its safe share until it reads the latest epoch.
				safe := &allocation{epoch: 0, def: make([]float64, e.n), overrides: map[int32][]float64{}}
				for i := range safe.def {
					safe.def[i] = e.cfg.MinShare
				}
				e.up[r] = true
				e.setApplied(r, safe)
				latest := e.published
				if e.shrink != nil {
					latest = e.shrink
				}
				e.push(&event{at: ev.at + e.delay(), kind: evApply, region: r, alloc: latest})
				e.checkSum()
			}
		case EventCoordinatorDown:
			e.coordUp = false
		case EventCoordinatorUp:
			e.coordUp = true
			e.maybeGrow()
		}
	}
	return nil
}

// collect builds region r's report for the interval and resets it: total
// offered rate, and per subject the rate of the most pressured subjects and
// of every subject the region holds an override for.
func (e *engine) collect(r int) *report {
	secs := e.cfg.ReportInterval.Seconds()
	rep := &report{offered: float64(e.intOffered[r]) / secs}
	type cand struct {
		j               int32
		denied, offered int64
	}
	seq := e.nextStamp()
	for j := range e.applied[r].overrides {
		rep.subjects = append(rep.subjects, demand{j, float64(e.offeredIn(r, j)) / secs})
		e.stamp[j] = seq
	}
	// The candidates: subjects with denials this interval. The counters
	// of every subject reset when the next interval touches them.
	cands := make([]cand, 0, len(e.denials[r]))
	for _, j := range e.denials[r] {
		sr := &e.sub[r][j]
		cands = append(cands, cand{j, sr.denied, sr.offered})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.denied != b.denied {
			return cmp.Compare(b.denied, a.denied)
		}
		return cmp.Compare(a.j, b.j)
	})
	if len(cands) > e.cfg.MaxOverrides {
		cands = cands[:e.cfg.MaxOverrides]
	}
	for _, c := range cands {
		if e.stamp[c.j] != seq { // not an override subject already in
			rep.subjects = append(rep.subjects, demand{c.j, float64(c.offered) / secs})
		}
	}
	// Most demanding first, so that which subjects get tracked when the
	// table is full never depends on map order.
	slices.SortFunc(rep.subjects, func(x, y demand) int {
		if x.v != y.v {
			if x.v > y.v {
				return -1
			}
			return 1
		}
		return cmp.Compare(x.j, y.j)
	})
	e.denials[r] = e.denials[r][:0]
	e.interval[r]++
	e.intOffered[r] = 0
	return rep
}

// offeredIn returns subject j's requests offered in region r this report
// interval.
func (e *engine) offeredIn(r int, j int32) int64 {
	if sr := &e.sub[r][j]; sr.interval == e.interval[r] {
		return sr.offered
	}
	return 0
}

// absorb folds a report into the coordinator's smoothed demand.
func (e *engine) absorb(r int, rep *report) {
	a := e.cfg.Smoothing
	e.sOffered[r] = allocator.Smooth(e.sOffered[r], rep.offered, a)
	seq := e.nextStamp()
	for _, jv := range rep.subjects {
		j, v := jv.j, jv.v
		e.stamp[j] = seq
		d, ok := e.sSubject[j]
		if !ok {
			if len(e.sSubject) >= 2*e.cfg.MaxOverrides {
				continue
			}
			d = make([]float64, e.n)
			e.sSubject[j] = d
		}
		d[r] = allocator.Smooth(d[r], v/e.sc.RefillPerSecond, a)
	}
	// Subjects tracked but absent from this report decay in this region.
	for j, d := range e.sSubject {
		if e.stamp[j] != seq {
			d[r] = allocator.Smooth(d[r], 0, a)
		}
	}
}

// nextStamp returns a fresh mark for e.stamp: subjects stamped with it
// are in the set being built.
func (e *engine) nextStamp() uint64 {
	e.stampSeq++
	return e.stampSeq
}

// live reports whether the coordinator still counts region r as holding
// its share: up, or down for less than the lease TTL plus skew margin.
func (e *engine) live(r int) bool {
	return e.up[r] || e.now < e.downAt[r]+e.cfg.LeaseTTL+e.cfg.SkewMargin
}

// rebalance computes and publishes a new allocation.
func (e *engine) rebalance() error {
	if e.shrink != nil {
		e.maybeGrow()
		if e.shrink != nil {
			return nil // still waiting for acknowledgements
		}
	}
	cur := e.published
	p := *e.cfg.Allocator
	regions := make([]allocator.Region, e.n)
	totalOff := 0.0
	for r := 0; r < e.n; r++ {
		if e.live(r) {
			totalOff += e.sOffered[r]
		}
	}
	for r := range regions {
		regions[r] = allocator.Region{Name: fmt.Sprintf("r%02d", r), Min: e.cfg.MinShare, Live: e.live(r) && e.up[r], Current: cur.def[r]}
		if totalOff > 0 {
			regions[r].Demand = e.sOffered[r] / totalOff
		}
		if !regions[r].Live && e.live(r) {
			// Down but its lease lives: it keeps its share.
			regions[r].Pinned, regions[r].Pin, regions[r].Live = true, cur.def[r], true
		}
	}
	def, err := allocator.Split(p, regions)
	if e.cfg.proposed != nil {
		def, err = e.cfg.proposed, nil
	}
	if err != nil {
		return fmt.Errorf("sim: default split at %v: %w", e.now, err)
	}
	next := &allocation{def: def, overrides: map[int32][]float64{}}
	// Subjects with their own allocation, most demanding first, bounded.
	type subj struct {
		j   int32
		sum float64
	}
	var subs []subj
	for j, d := range e.sSubject {
		s := 0.0
		for r := range d {
			s += d[r]
		}
		if s < 0.05 {
			delete(e.sSubject, j)
			continue
		}
		subs = append(subs, subj{j, s})
	}
	sort.Slice(subs, func(a, b int) bool {
		if subs[a].sum != subs[b].sum {
			return subs[a].sum > subs[b].sum
		}
		return subs[a].j < subs[b].j
	})
	if len(subs) > e.cfg.MaxOverrides {
		subs = subs[:e.cfg.MaxOverrides]
	}
	for _, s := range subs {
		if e.cfg.proposed != nil {
			break
		}
		d := e.sSubject[s.j]
		for r := range regions {
			regions[r].Demand = d[r]
			regions[r].Current = cur.share(r, s.j)
			if regions[r].Pinned {
				regions[r].Pin = regions[r].Current
			}
		}
		sh, err := allocator.Split(p, regions)
		if err != nil {
			return fmt.Errorf("sim: subject split at %v: %w", e.now, err)
		}
		next.overrides[s.j] = sh
	}
	if sameAllocation(cur, next, e.n) {
		return nil
	}
	if e.cfg.Protocol == Naive {
		e.publish(next)
		e.published = next
		return nil
	}
	// Two-step: min(old, new) for every allocation unit in either.
	shrink := &allocation{def: make([]float64, e.n), overrides: map[int32][]float64{}}
	for r := 0; r < e.n; r++ {
		shrink.def[r] = math.Min(cur.def[r], next.def[r])
	}
	units := map[int32]bool{}
	for j := range cur.overrides {
		units[j] = true
	}
	for j := range next.overrides {
		units[j] = true
	}
	for j := range units {
		o := make([]float64, e.n)
		for r := range o {
			o[r] = math.Min(cur.share(r, j), next.share(r, j))
		}
		shrink.overrides[j] = o
	}
	e.publish(shrink)
	e.shrink, e.pending = shrink, next
	e.maybeGrow()
	return nil
}

func sameAllocation(a, b *allocation, n int) bool {
	if len(a.overrides) != len(b.overrides) {
		return false
	}
	for r := 0; r < n; r++ {
		if a.def[r] != b.def[r] {
			return false
		}
	}
	for j, o := range a.overrides {
		p, ok := b.overrides[j]
		if !ok {
			return false
		}
		for r := range o {
			if o[r] != p[r] {
				return false
			}
		}
	}
	return true
}

// publish gives a an epoch and sends it to every up region.
func (e *engine) publish(a *allocation) {
	e.epoch++
	a.epoch = e.epoch
	for r := 0; r < e.n; r++ {
		if e.up[r] {
			e.push(&event{at: e.now + e.delay(), kind: evApply, region: r, alloc: a})
		}
	}
}

// maybeGrow publishes the pending growth once every live region has
// acknowledged the shrink epoch (a region whose lease expired holds only
// its safe share and need not acknowledge).
func (e *engine) maybeGrow() {
	if e.shrink == nil {
		return
	}
	for r := 0; r < e.n; r++ {
		if e.live(r) && e.acked[r] < e.shrink.epoch {
			return
		}
	}
	e.publish(e.pending)
	e.published, e.shrink, e.pending = e.pending, nil, nil
}

// checkSum records the largest Σ of enforced shares over regions, for the
// default and every subject with an override anywhere. A down region counts
// at its safe share, which it returns with.
func (e *engine) checkSum() {
	share := func(r int, j int32, def bool) float64 {
		if !e.up[r] {
			return e.cfg.MinShare
		}
		if def {
			return e.applied[r].def[r]
		}
		return e.applied[r].share(r, j)
	}
	sum := 0.0
	for r := 0; r < e.n; r++ {
		sum += share(r, 0, true)
	}
	e.maxSum = math.Max(e.maxSum, sum)
	seen := e.nextStamp()
	for r := 0; r < e.n; r++ {
		for j := range e.applied[r].overrides {
			if e.stamp[j] == seen {
				continue
			}
			e.stamp[j] = seen
			s := 0.0
			for q := 0; q < e.n; q++ {
				s += share(q, j, false)
			}
			e.maxSum = math.Max(e.maxSum, s)
		}
	}
}

// result turns the counters into figures.
func (e *engine) result() *Result {
	sc, c := e.sc, e.cfg
	res := &Result{
		Scenario: sc.Name, RebalanceIntervalS: c.RebalanceInterval.Seconds(), ReportIntervalS: c.ReportInterval.Seconds(),
		Protocol: string(c.Protocol), Algorithm: string(c.Allocator.Algorithm), Overcommit: c.Allocator.Overcommit,
		Seed: c.Seed, Regions: e.n, Subjects: sc.Subjects, DurationS: time.Duration(sc.Duration).Seconds(),
		Offered: e.offered, MaxShareSum: round(e.maxSum), Epochs: e.epoch,
		ConvergenceS: []float64{},
	}
	if res.Algorithm == "" {
		res.Algorithm = string(allocator.MaxMinFair)
	}
	b := e.baselines()
	if e.sys != nil {
		res.Figures = e.figures(e.sys, b)
		res.BucketCalls = e.sys.calls
	}
	if b != nil {
		res.IdealAdmitted = b.ideal.admitted
		res.Baselines = map[string]Figures{
			BaselineIdeal:       e.figures(b.ideal, b),
			BaselineIndependent: e.figures(b.independent, b),
			BaselineStaticEqual: e.figures(b.static, b),
		}
		for _, sh := range sc.Shifts {
			res.ConvergenceS = append(res.ConvergenceS, e.convergence(time.Duration(sh), b))
		}
		bin := float64(e.binTicks) * e.tick.Seconds()
		ticks := int64(time.Duration(sc.Duration) / e.tick)
		// The last bin may be shorter: rates divide by each bin's length.
		binLen := func(k int) float64 {
			if k == len(b.seriesIdeal)-1 {
				return float64(ticks-int64(k)*e.binTicks) * e.tick.Seconds()
			}
			return bin
		}
		s := &Series{BinSeconds: bin, Regions: make([][]float64, e.n), Total: make([]float64, len(b.seriesIdeal)), Ideal: make([]float64, len(b.seriesIdeal))}
		for r := range s.Regions {
			s.Regions[r] = make([]float64, len(b.seriesIdeal))
			for k, v := range e.seriesRegion[r] {
				s.Regions[r][k] = round(v / binLen(k))
				s.Total[k] += v
			}
		}
		for k := range s.Total {
			s.Total[k] = round(s.Total[k] / binLen(k))
			s.Ideal[k] = round(b.seriesIdeal[k] / binLen(k))
		}
		res.Series = s
	}
	return res
}

// figures are m's figures; under-admission against b's ideal bucket when b
// is not nil.
func (e *engine) figures(m *model, b *baseRun) Figures {
	o := m.win.overshoot()
	f := Figures{Overshoot1s: round(o[0]), Overshoot10s: round(o[1]), Overshoot60s: round(o[2]), Admitted: m.admitted}
	if b != nil {
		f.UnderAdmission = round(UnderAdmission(m.admitted, b.ideal.admitted))
	}
	return f
}

// baselines returns the baselines over every subject: the shared part, the
// part decided here, or both merged; nil when there are none.
func (e *engine) baselines() *baseRun {
	switch {
	case e.base == nil:
		return e.own
	case e.own == nil:
		return e.base
	}
	a, b := e.base, e.own
	m := &baseRun{ideal: a.ideal.merged(b.ideal), independent: a.independent.merged(b.independent), static: a.static.merged(b.static),
		perSecondIdeal: make([]int64, len(a.perSecondIdeal)), seriesIdeal: make([]float64, len(a.seriesIdeal))}
	for k := range m.perSecondIdeal {
		m.perSecondIdeal[k] = a.perSecondIdeal[k] + b.perSecondIdeal[k]
	}
	// Sums of whole counts below 2^53: exact in any order.
	for k := range m.seriesIdeal {
		m.seriesIdeal[k] = a.seriesIdeal[k] + b.seriesIdeal[k]
	}
	return m
}

// convergence returns the seconds after shift until admitted over the next
// 10 s reaches 95% of b's ideal bucket's, or −1.
func (e *engine) convergence(shift time.Duration, b *baseRun) float64 {
	const w = 10
	start := int(shift / time.Second)
	for s := start; s+w <= len(e.perSecondSys); s++ {
		var a, i int64
		for k := s; k < s+w; k++ {
			a += e.perSecondSys[k]
			i += b.perSecondIdeal[k]
		}
		if i == 0 || float64(a) >= 0.95*float64(i) {
			return float64(s - start)
		}
	}
	return -1
}

// round keeps 6 significant decimals so reports stay stable and readable.
func round(v float64) float64 { return math.Round(v*1e6) / 1e6 }
