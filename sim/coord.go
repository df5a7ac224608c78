package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/quotacoord/quota/allocator"
)

// handle runs one control-plane event.
func (e *engine) handle(ev *event) error {
	switch ev.kind {
	case evReport:
		e.push(&event{at: ev.at + e.cfg.ReportInterval, kind: evReport, region: ev.region})
		rep := e.collect(ev.region)
		// A region that came back reports once it has served a whole
		// interval, as a node that starts reports one interval after
		// its start: the ticks before only reset its counters.
		if !e.up[ev.region] || ev.at-e.upAt[ev.region] < e.cfg.ReportInterval || e.rng.Float64() < e.cfg.LostReports {
			return nil
		}
		at := ev.at + e.delay()
		if e.rng.Float64() < e.cfg.LateReports {
			at += e.cfg.ReportInterval
		}
		e.push(&event{at: at, kind: evReportArrive, region: ev.region, rep: rep})
	case evReportArrive:
		// etcd holds a region's latest report: a region writes its
		// reports in order, so one collected earlier never replaces it.
		if l := e.latest[ev.region]; l == nil || ev.rep.interval > l.interval {
			e.latest[ev.region] = ev.rep
		}
		// The demand watch (rebalance.Loop.lead): the first report of a
		// region back from having no lease brings a full round at once.
		if e.returned[ev.region] && e.coordUp && e.up[ev.region] {
			e.returned[ev.region] = false
			e.push(&event{at: ev.at, kind: evRebalance, gen: e.term, once: true})
		}
	case evRebalance:
		if ev.gen != e.term {
			return nil // scheduled by a leader that is gone
		}
		if !ev.once {
			e.push(&event{at: ev.at + e.cfg.RebalanceInterval, kind: evRebalance, gen: e.term})
		}
		return e.rebalance()
	case evRecheck:
		e.rechecks = false
		if e.coordUp {
			e.ackRound()
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
			e.ackRound()
		}
	case evScenario:
		r := ev.sc.Region
		switch ev.sc.Kind {
		case EventRegionDown:
			if e.up[r] {
				e.up[r], e.downAt[r] = false, ev.at
				e.checkSum()
				if e.coordUp {
					// The registration watch: growth may wait for this
					// region's lease and skew margin now.
					e.ackRound()
				}
			}
		case EventRegionUp:
			if !e.up[r] {
				// A leader saw its lease end (the registration watch's
				// round, or a new leader's first round): it is back.
				if e.coordUp && !e.registered(r) {
					e.returned[r] = true
				}
				// Back at its safe share until it reads the latest epoch.
				safe := &allocation{epoch: 0, def: make([]float64, e.n), overrides: map[int32][]float64{}}
				for i := range safe.def {
					safe.def[i] = e.cfg.MinShare
				}
				e.up[r], e.upAt[r] = true, ev.at
				e.acked[r] = 0 // a new registration acknowledges afresh
				e.setApplied(r, safe)
				latest := e.published
				if e.shrink != nil {
					latest = e.shrink
				}
				e.push(&event{at: ev.at + e.delay(), kind: evApply, region: r, alloc: latest})
				e.checkSum()
			}
		case EventCoordinatorDown:
			if e.coordUp {
				e.coordUp = false
				e.term++ // its round timer stops
			}
		case EventCoordinatorUp:
			if !e.coordUp {
				// A new leader (rebalance.Loop.lead): empty smoothed
				// state, growth held for a skew margin, a full round at
				// once and then every RebalanceInterval.
				e.coordUp = true
				e.term++
				e.leadSince = ev.at
				clear(e.hasDemand)
				clear(e.sOffered)
				clear(e.returned)
				e.owed = false
				clear(e.sSubject)
				e.push(&event{at: ev.at, kind: evRebalance, gen: e.term})
			}
		}
	}
	return nil
}

// collect builds region r's report for the interval and starts the next:
// the offered rate over all subjects, and the pressured subjects (a
// request denied, or one that left the bucket below half its capacity:
// internal/demand and internal/regional) with their pressured offered
// rate, most pressured first, at most MaxOverrides (the recorder's top K;
// the sim counts exactly where the recorder's Space-Saving summary bounds
// from above, which is exact while a shard holds fewer subjects than K).
func (e *engine) collect(r int) *report {
	secs := e.cfg.ReportInterval.Seconds()
	rep := &report{interval: e.interval[r], offered: float64(e.intOffered[r]) / secs}
	type cand struct {
		j int32
		p int64
	}
	// The subjects' counters reset when the next interval first presses
	// them.
	cands := make([]cand, 0, len(e.pressuredJ[r]))
	for _, j := range e.pressuredJ[r] {
		cands = append(cands, cand{j, e.sub[r][j].pressured})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.p != b.p {
			return cmp.Compare(b.p, a.p)
		}
		return cmp.Compare(a.j, b.j)
	})
	if len(cands) > e.cfg.MaxOverrides {
		cands = cands[:e.cfg.MaxOverrides]
	}
	rep.subjects = make([]demand, len(cands))
	for i, c := range cands {
		rep.subjects[i] = demand{c.j, float64(c.p) / secs}
	}
	e.pressuredJ[r] = e.pressuredJ[r][:0]
	e.interval[r]++
	e.intOffered[r] = 0
	return rep
}

// observe folds the latest reports of registered regions into the
// smoothed demand, once per round, exactly as the coordinator does
// (rebalance's state.observe): each region's share of the offered load,
// its first observation taken as it is and only from a report; and per
// pressured subject its offered rate over the global rate, smoothed in
// every registered region (0 where not reported), taken as it is when the
// subject is new, decayed towards 0 in rounds without any report of it
// and forgotten after OverrideRounds such rounds. At most MaxOverrides
// subjects of a report and 4·MaxOverrides of a round are read, and at most
// 2·MaxOverrides subjects kept; new subjects are taken in region order,
// then report order (the coordinator takes them in map order).
func (e *engine) observe() {
	a := e.cfg.Smoothing
	total := 0.0
	for r := 0; r < e.n; r++ {
		if !e.registered(r) {
			// Its lease ended: its report is gone with it.
			e.latest[r], e.hasDemand[r], e.sOffered[r], e.returned[r] = nil, false, 0, false
			continue
		}
		if e.latest[r] != nil {
			e.returned[r] = false
		}
		if l := e.latest[r]; l != nil && l.offered > 0 {
			total += l.offered
		}
	}
	if total > 0 {
		for r := 0; r < e.n; r++ {
			if !e.registered(r) {
				continue
			}
			obs := 0.0
			if l := e.latest[r]; l != nil && l.offered > 0 {
				obs = l.offered / total
			}
			if e.hasDemand[r] {
				e.sOffered[r] = allocator.Smooth(e.sOffered[r], obs, a)
			} else if e.latest[r] != nil {
				// The first observation, from a report only.
				e.sOffered[r], e.hasDemand[r] = obs, true
			}
		}
	}
	type observed struct {
		j int32
		d []float64
	}
	var round []observed
	clear(e.obsIdx)
	for r := 0; r < e.n; r++ {
		l := e.latest[r]
		if l == nil {
			continue
		}
		for i, s := range l.subjects {
			if i >= e.cfg.MaxOverrides {
				break
			}
			k, ok := e.obsIdx[s.j]
			if !ok {
				if len(round) >= 4*e.cfg.MaxOverrides {
					continue
				}
				k = len(round)
				e.obsIdx[s.j] = k
				round = append(round, observed{s.j, make([]float64, e.n)})
			}
			round[k].d[r] = s.v / e.sc.RefillPerSecond
		}
	}
	for j, sd := range e.sSubject {
		if _, ok := e.obsIdx[j]; ok {
			continue
		}
		sd.idle++
		for r := range sd.d {
			sd.d[r] = allocator.Smooth(sd.d[r], 0, a)
		}
		if sd.idle >= e.cfg.OverrideRounds {
			delete(e.sSubject, j)
		}
	}
	for _, o := range round {
		sd := e.sSubject[o.j]
		if sd == nil {
			if len(e.sSubject) >= 2*e.cfg.MaxOverrides {
				continue
			}
			e.sSubject[o.j] = &subjectDemand{d: o.d}
			continue
		}
		sd.idle = 0
		for r := 0; r < e.n; r++ {
			if e.registered(r) {
				sd.d[r] = allocator.Smooth(sd.d[r], o.d[r], a)
			}
		}
	}
}

// nextStamp returns a fresh mark for e.stamp: subjects stamped with it
// are in the set being built.
func (e *engine) nextStamp() uint64 {
	e.stampSeq++
	return e.stampSeq
}

// registered reports whether region r holds a registration lease: up, or
// down for less than LeaseTTL. The coordinator reads its latest report
// and counts it live while it does.
func (e *engine) registered(r int) bool {
	return e.up[r] || e.now < e.downAt[r]+e.cfg.LeaseTTL
}

// live reports whether the coordinator still counts region r as possibly
// enforcing its shares: up, or down for less than the lease TTL plus the
// skew margin.
func (e *engine) live(r int) bool {
	return e.up[r] || e.now < e.downAt[r]+e.cfg.LeaseTTL+e.cfg.SkewMargin
}

// eq is the tolerance under which two shares are the same (rebalance's).
const eq = 1e-12

// rebalance runs one full round of the coordinator (rebalance's plan):
// observe the reports; a pending shrink then either grows or keeps
// waiting, and nothing else is planned; otherwise split the default and
// each of the most demanding pressured subjects, and publish what changed.
func (e *engine) rebalance() error {
	e.observe()
	if e.shrink != nil {
		// Still waiting: this round's demand is owed a full round once
		// the shrink grows (ackRound).
		e.owed = !e.maybeGrow()
		return nil
	}
	cur := e.published
	p := *e.cfg.Allocator
	regions := make([]allocator.Region, e.n)
	for r := range regions {
		regions[r] = allocator.Region{Name: regionName(r), Weight: 1, Min: e.cfg.MinShare, Live: e.registered(r), Current: cur.def[r]}
		if e.hasDemand[r] {
			regions[r].Demand = e.sOffered[r]
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
	if e.cfg.proposed == nil {
		for j, sd := range e.sSubject {
			s := 0.0
			for _, v := range sd.d {
				s += v
			}
			subs = append(subs, subj{j, s})
		}
	}
	slices.SortFunc(subs, func(a, b subj) int {
		if a.sum != b.sum {
			return cmp.Compare(b.sum, a.sum)
		}
		return cmp.Compare(a.j, b.j)
	})
	if len(subs) > e.cfg.MaxOverrides {
		subs = subs[:e.cfg.MaxOverrides]
	}
	for _, s := range subs {
		d := e.sSubject[s.j].d
		for r := range regions {
			regions[r].Demand = d[r]
			regions[r].Current = cur.share(r, s.j)
		}
		sh, err := allocator.Split(p, regions)
		if err != nil {
			return fmt.Errorf("sim: subject split at %v: %w", e.now, err)
		}
		// A split equal to the default needs no override.
		same := true
		for r := range sh {
			if math.Abs(sh[r]-def[r]) > 1e-9 {
				same = false
				break
			}
		}
		if !same {
			next.overrides[s.j] = sh
		}
	}
	if !changed(cur, next, e.n) {
		return nil
	}
	if e.cfg.Protocol == Naive || !shrinks(cur, next, e.n) {
		// Naive, or growth only: one stable epoch.
		e.publish(next)
		e.published = next
		return nil
	}
	// Two-step: min(old, new) for every allocation unit in either.
	shrink := &allocation{def: make([]float64, e.n), overrides: map[int32][]float64{}}
	for r := 0; r < e.n; r++ {
		shrink.def[r] = math.Min(cur.def[r], next.def[r])
	}
	for j := range cur.overrides {
		shrink.overrides[j] = lowerOf(cur, next, j, e.n)
	}
	for j := range next.overrides {
		if _, ok := shrink.overrides[j]; !ok {
			shrink.overrides[j] = lowerOf(cur, next, j, e.n)
		}
	}
	e.publish(shrink)
	e.shrink, e.pending = shrink, next
	e.maybeGrow()
	return nil
}

// regionNames are the allocator's names of the regions (the deployment's,
// demo.ScenarioRegions).
var regionNames = func() []string {
	out := make([]string, MaxRegions)
	for i := range out {
		out[i] = fmt.Sprintf("r%02d", i)
	}
	return out
}()

func regionName(r int) string { return regionNames[r] }

// lowerOf is min(a, b) of subject j's shares in every region.
func lowerOf(a, b *allocation, j int32, n int) []float64 {
	o := make([]float64, n)
	for r := range o {
		o[r] = math.Min(a.share(r, j), b.share(r, j))
	}
	return o
}

// changed says whether b differs from a: another set of overrides, or a
// share (default or subject) that moved by more than eq.
func changed(a, b *allocation, n int) bool {
	if len(a.overrides) != len(b.overrides) {
		return true
	}
	for j := range a.overrides {
		if _, ok := b.overrides[j]; !ok {
			return true
		}
	}
	for r := 0; r < n; r++ {
		if math.Abs(a.def[r]-b.def[r]) > eq {
			return true
		}
	}
	for j := range a.overrides {
		for r := 0; r < n; r++ {
			if math.Abs(a.share(r, j)-b.share(r, j)) > eq {
				return true
			}
		}
	}
	return false
}

// shrinks says whether some share (default, or of a subject with an
// override in either) is lower in b than in a by more than eq.
func shrinks(a, b *allocation, n int) bool {
	for r := 0; r < n; r++ {
		if b.def[r] < a.def[r]-eq {
			return true
		}
	}
	for _, ov := range []map[int32][]float64{a.overrides, b.overrides} {
		for j := range ov {
			for r := 0; r < n; r++ {
				if b.share(r, j) < a.share(r, j)-eq {
					return true
				}
			}
		}
	}
	return false
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

// maybeGrow publishes the pending growth once the leader has led for a
// skew margin and every region has acknowledged the shrink epoch or lost
// its lease a skew margin ago (rebalance's ackWait), and reports whether it
// did. While it waits on a margin, it rechecks as the coordinator does
// (every min(RebalanceInterval, max(SkewMargin/4, 50 ms))).
func (e *engine) maybeGrow() (grew bool) {
	if e.shrink == nil {
		return false
	}
	if e.now < e.leadSince+e.cfg.SkewMargin {
		e.recheck()
		return false
	}
	for r := 0; r < e.n; r++ {
		switch {
		case e.registered(r):
			if e.acked[r] < e.shrink.epoch {
				if !e.up[r] {
					e.recheck() // its lease will end without an acknowledgement
				}
				return false
			}
		case e.live(r):
			e.recheck() // its lease ended less than a skew margin ago
			return false
		}
	}
	e.publish(e.pending)
	e.published, e.shrink, e.pending = e.pending, nil, nil
	return true
}

// ackRound is a round on an acknowledgement, a registration change or a
// recheck (rebalance.Loop.lead): it only grows a pending shrink, and when
// a full round waited on that shrink (owed), a full round follows at once.
func (e *engine) ackRound() {
	if e.maybeGrow() && e.owed {
		e.owed = false
		e.push(&event{at: e.now, kind: evRebalance, gen: e.term, once: true})
	}
}

// recheck schedules one more look at a waiting growth.
func (e *engine) recheck() {
	if e.rechecks {
		return
	}
	e.rechecks = true
	every := min(e.cfg.RebalanceInterval, max(e.cfg.SkewMargin/4, 50*time.Millisecond))
	e.push(&event{at: e.now + every, kind: evRecheck})
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
