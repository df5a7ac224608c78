package sim

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/plan"
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
		// The demand watch: the first report of a region back from
		// having no registered node brings a full round at once.
		if e.leader != nil && e.up[ev.region] && e.leader.ReportArrived(regionName(ev.region)) {
			e.push(&event{at: ev.at, kind: evRebalance, gen: e.term, once: true})
		}
	case evRebalance:
		if ev.gen != e.term {
			return nil // scheduled by a leader that is gone
		}
		if !ev.once {
			e.push(&event{at: ev.at + e.cfg.RebalanceInterval, kind: evRebalance, gen: e.term})
		}
		return e.round(true)
	case evRecheck:
		e.rechecks = false
		return e.round(false)
	case evApply:
		if e.up[ev.region] && ev.alloc.epoch > e.applied[ev.region].epoch {
			e.setApplied(ev.region, ev.alloc)
			e.checkSum()
			node := &e.regs[ev.region][len(e.regs[ev.region])-1] // the node up now
			e.push(&event{at: ev.at + e.delay(), kind: evAck, region: ev.region, alloc: ev.alloc, node: node.seq})
		}
	case evAck:
		for i := range e.regs[ev.region] {
			if nd := &e.regs[ev.region][i]; nd.seq == ev.node {
				nd.acked = max(nd.acked, uint64(ev.alloc.epoch))
			}
		}
		return e.round(false)
	case evLeaseEnd:
		// The registration watch sees the node's key deleted with its
		// lease.
		regs := e.regs[ev.region][:0]
		for _, nd := range e.regs[ev.region] {
			if nd.until > e.now {
				regs = append(regs, nd)
			}
		}
		e.regs[ev.region] = regs
		return e.round(false)
	case evScenario:
		r := ev.sc.Region
		switch ev.sc.Kind {
		case EventRegionDown:
			if e.up[r] {
				e.up[r], e.downAt[r] = false, ev.at
				// Its registration lives until its lease ends.
				until := ev.at + e.cfg.LeaseTTL
				e.regs[r][len(e.regs[r])-1].until = until
				e.push(&event{at: until, kind: evLeaseEnd, region: r})
				e.checkSum()
			}
		case EventRegionUp:
			if !e.up[r] {
				// A new node registers, at its safe share until it reads
				// the latest epoch; it acknowledges afresh.
				safe := &allocation{epoch: 0, def: make([]float64, e.n), overrides: map[int32][]float64{}}
				for i := range safe.def {
					safe.def[i] = e.cfg.MinShare
				}
				e.up[r], e.upAt[r] = true, ev.at
				e.register(r)
				e.setApplied(r, safe)
				e.push(&event{at: ev.at + e.delay(), kind: evApply, region: r, alloc: e.allocationOf(e.current)})
				e.checkSum()
				// The registration watch's round.
				return e.round(false)
			}
		case EventCoordinatorDown:
			if e.leader != nil {
				e.leader = nil
				e.term++ // its round timer stops
			}
		case EventCoordinatorUp:
			if e.leader == nil {
				// A new leader: empty smoothed state, growth held for a
				// skew margin, a full round at once and then every
				// RebalanceInterval.
				if err := e.lead(ev.at); err != nil {
					return err
				}
				e.term++
				e.push(&event{at: ev.at, kind: evRebalance, gen: e.term})
			}
		}
	}
	return nil
}

// simNode is one registration of a region's node.
type simNode struct {
	seq   int           // the region's node number, from 1
	id    string        // its node id in the planner's view
	acked uint64        // the latest epoch it acknowledged
	until time.Duration // when its lease ends (maxTime while it is up)
}

const maxTime = time.Duration(math.MaxInt64)

// register adds a new node to region r, up from now.
func (e *engine) register(r int) {
	seq := 1
	if k := len(e.regs[r]); k > 0 {
		seq = e.regs[r][k-1].seq + 1
	}
	e.regs[r] = append(e.regs[r], simNode{seq: seq, id: "n" + strconv.Itoa(seq), until: maxTime})
}

// lead makes a new leader that took over at at.
func (e *engine) lead(at time.Duration) error {
	l, err := plan.NewLeader(e.params, e.instant(at))
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	e.leader = l
	return nil
}

// instant is the planner's time for the simulated instant at (a run
// starts at the Unix epoch).
func (e *engine) instant(at time.Duration) time.Time { return time.Unix(0, 0).Add(at) }

// view is what the coordinator reads from etcd now: the registered nodes
// with their acknowledgements and the latest demand report of every
// region with a registered node (a report lives under its node's lease).
// The view is kept between rounds and updated in place, except the nodes'
// Acked maps, which the planner keeps (plan.Node): a changed one is new.
func (e *engine) view() *plan.View {
	v := e.v
	if v == nil {
		v = &plan.View{Regions: make(map[string]map[string]plan.Node, e.n), Demand: make(map[string]map[string]plan.PolicyDemand, e.n)}
		e.v, e.viewed = v, make([]*report, e.n)
	}
	for r := 0; r < e.n; r++ {
		name := regionName(r)
		nodes := v.Regions[name]
		registered := 0
		for _, nd := range e.regs[r] {
			if e.now >= nd.until {
				continue
			}
			registered++
			if n, ok := nodes[nd.id]; ok {
				// A new map, not the old one changed: the planner keeps
				// the Acked maps of the views it tracked (plan.Node).
				if n.Acked[e.policy.Name] != nd.acked {
					nodes[nd.id] = plan.Node{Acked: map[string]uint64{e.policy.Name: nd.acked}}
				}
				continue
			}
			if nodes == nil {
				nodes = make(map[string]plan.Node, 1)
				v.Regions[name] = nodes
			}
			nodes[nd.id] = plan.Node{Acked: map[string]uint64{e.policy.Name: nd.acked}}
		}
		if registered < len(nodes) {
			for id := range nodes {
				if !e.registeredNode(r, id) {
					delete(nodes, id)
				}
			}
		}
		if registered == 0 {
			delete(v.Regions, name)
			delete(v.Demand, name)
			e.latest[r], e.viewed[r] = nil, nil // gone with the lease
			continue
		}
		l := e.latest[r]
		switch {
		case l == nil:
			delete(v.Demand, name)
		case l != e.viewed[r]:
			d := plan.PolicyDemand{Offered: l.offered, Pressured: make([]plan.SubjectDemand, len(l.subjects))}
			for i, s := range l.subjects {
				d.Pressured[i] = plan.SubjectDemand{Subject: e.subjectName(s.j), Offered: s.v}
			}
			v.Demand[name] = map[string]plan.PolicyDemand{e.policy.Name: d}
		}
		e.viewed[r] = l
	}
	return v
}

// registeredNode says node id of region r is registered now.
func (e *engine) registeredNode(r int, id string) bool {
	for _, nd := range e.regs[r] {
		if nd.id == id {
			return e.now < nd.until
		}
	}
	return false
}

// round runs one round of the coordinator (plan.Leader) and publishes
// what it decides: a full round at every RebalanceInterval, other rounds
// on an acknowledgement, a registration change or a recheck.
func (e *engine) round(full bool) error {
	if e.leader == nil {
		return nil
	}
	now := e.instant(e.now)
	v := e.view()
	e.leader.Track(now, v, map[string]*plan.Allocation{e.policy.Name: e.current})
	if full {
		e.leader.Observe(v, []plan.Policy{e.policy})
	}
	d := e.leader.Plan(now, v, e.policy, e.current, e.control, full)
	if d.Publish == nil && d.Note != "" && !d.Waiting {
		return fmt.Errorf("sim: round at %v: %s", e.now, d.Note)
	}
	if d.Publish != nil {
		e.current = d.Publish
		e.publish(e.allocationOf(d.Publish))
	}
	if d.Waiting && !d.WaitUntil.IsZero() {
		e.recheck()
	}
	if e.leader.Settle(full, d.Deferred, d.Publish != nil) {
		e.push(&event{at: e.now, kind: evRebalance, gen: e.term, once: true})
	}
	return nil
}

// allocationOf is a published allocation in the engine's terms (shares by region
// index, overrides by subject index).
func (e *engine) allocationOf(a *plan.Allocation) *allocation {
	out := &allocation{epoch: int(a.Epoch), def: make([]float64, e.n), overrides: make(map[int32][]float64, len(a.Overrides))}
	for r := range out.def {
		out.def[r] = a.Default[regionName(r)]
	}
	for s, m := range a.Overrides {
		j, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			continue // not a subject of the simulator's
		}
		o := make([]float64, e.n)
		for r := range o {
			o[r] = m[regionName(r)]
		}
		out.overrides[int32(j)] = o
	}
	return out
}

// subjectName is subject j's name for the planner: zero-padded, so that
// names sort as the indexes do. Names are made once per subject.
func (e *engine) subjectName(j int32) string {
	if s, ok := e.names[j]; ok {
		return s
	}
	s := strconv.Itoa(int(j))
	if len(s) < 7 {
		s = "0000000"[len(s):] + s
	}
	e.names[j] = s
	return s
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
	// The subjects' counters reset when the next interval first presses
	// them. The order (most pressured first, then the lower subject) is
	// total: inserting each subject among the first MaxOverrides so far
	// keeps exactly the first MaxOverrides of the sorted list.
	k := e.cfg.MaxOverrides
	cands := e.cands[:0]
	for _, j := range e.pressuredJ[r] {
		c := demandCount{j, e.sub[r][j].pressured}
		if len(cands) == k && (k == 0 || !c.before(cands[k-1])) {
			continue
		}
		if len(cands) < k {
			cands = append(cands, c)
		}
		i := len(cands) - 1
		for ; i > 0 && c.before(cands[i-1]); i-- {
			cands[i] = cands[i-1]
		}
		cands[i] = c
	}
	e.cands = cands
	rep.subjects = make([]demand, len(cands))
	for i, c := range cands {
		rep.subjects[i] = demand{c.j, float64(c.p) / secs}
	}
	e.pressuredJ[r] = e.pressuredJ[r][:0]
	e.interval[r]++
	e.intOffered[r] = 0
	return rep
}

// demandCount is a subject's pressured requests in a report interval.
type demandCount struct {
	j int32
	p int64
}

// before says c comes before d in a report: more pressured, or as
// pressured and a lower subject.
func (c demandCount) before(d demandCount) bool {
	return c.p > d.p || (c.p == d.p && c.j < d.j)
}

// nextStamp returns a fresh mark for e.stamp: subjects stamped with it
// are in the set being built.
func (e *engine) nextStamp() uint64 {
	e.stampSeq++
	return e.stampSeq
}

// regionNames are the planner's names of the regions (the deployment's,
// demo.ScenarioRegions).
var regionNames = func() []string {
	out := make([]string, MaxScenarioRegions)
	for i := range out {
		out[i] = fmt.Sprintf("r%02d", i)
	}
	return out
}()

func regionName(r int) string { return regionNames[r] }

// publish sends a to every up region.
func (e *engine) publish(a *allocation) {
	for r := 0; r < e.n; r++ {
		if e.up[r] {
			e.push(&event{at: e.now + e.delay(), kind: evApply, region: r, alloc: a})
		}
	}
}

// recheck schedules one more round while a growth waits on a skew margin,
// as the coordinator does (every min(RebalanceInterval, max(SkewMargin/4,
// 50 ms))).
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
		Protocol: string(c.Protocol), NoShareRules: c.NoShareRules, Algorithm: string(c.Allocator.Algorithm), Overcommit: c.Allocator.Overcommit,
		Seed: c.Seed, Regions: e.n, Subjects: sc.Subjects, DurationS: time.Duration(sc.Duration).Seconds(),
		Offered: e.offered, MaxShareSum: round(e.maxSum), Epochs: int(e.current.Epoch),
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
	if m.aligned != nil {
		f.OvershootWindow = round(max(0, float64(m.aligned.best)/float64(e.capacity)-1))
	}
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
