package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/bucket"
)

// Protocol is how the coordinator publishes a new allocation.
type Protocol string

// The protocols.
const (
	// TwoStep publishes min(old, new) first and the new shares only after
	// every live region acknowledged the shrink.
	TwoStep Protocol = "two-step"
	// Naive publishes the new shares at once; regions apply them at
	// different moments, so Σ shares may exceed 1 + ε for a while.
	Naive Protocol = "naive"
)

// Config is one run. Zero fields take the documented defaults.
type Config struct {
	Scenario *Scenario
	// Regions, Subjects and Duration override the scenario's when > 0.
	Regions  int
	Subjects int
	Duration time.Duration
	Seed     uint64
	// Allocator is passed to allocator.Split each round. Default: MaxMinFair,
	// MaxStep 0.25, DeadBand 0.01.
	Allocator *allocator.Params
	// Protocol defaults to TwoStep.
	Protocol Protocol
	// RebalanceInterval defaults to 5 s, ReportInterval to 1 s.
	RebalanceInterval time.Duration
	ReportInterval    time.Duration
	// PropagationDelay is the mean one-way delay between coordinator and a
	// region (etcd write, watch, apply); each message draws uniformly from
	// [0.5, 1.5) times it. Default 300 ms; negative means none.
	PropagationDelay time.Duration
	// LostReports and LateReports are probabilities that a demand report
	// is lost, or arrives one report interval late.
	LostReports float64
	LateReports float64
	// LeaseTTL is how long after a region dies the coordinator still counts
	// it as holding its share; SkewMargin is added. Defaults 10 s and 1 s.
	LeaseTTL   time.Duration
	SkewMargin time.Duration
	// Smoothing is the α of the demand average. Default 0.5.
	Smoothing float64
	// MinShare is every region's guaranteed minimum. Default 0.
	MinShare float64
	// MaxOverrides bounds the subjects with their own allocation. Default 32.
	MaxOverrides int
	// SeriesBins is the number of points of the per-region series.
	// Default 360.
	SeriesBins int
	// InitialShares is the default allocation in force at the start;
	// nil means an equal split of 1 + ε.
	InitialShares []float64
	// proposed, when set, is published at every rebalance instead of a
	// split (PredictOvershoot).
	proposed []float64
	// Baselines also runs the three baseline models on the same stream.
	// Default true (set NoBaselines to skip them).
	NoBaselines bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Scenario == nil {
		return c, errors.New("sim: config has no scenario")
	}
	s := *c.Scenario
	if c.Regions > 0 {
		s.Regions = c.Regions
	}
	if c.Subjects > 0 {
		s.Subjects = c.Subjects
	}
	if c.Duration > 0 {
		// A shorter run keeps the events and shifts that fall inside it.
		s.Duration = Duration(c.Duration)
		s.Events = nil
		for _, ev := range c.Scenario.Events {
			if ev.At <= s.Duration {
				s.Events = append(s.Events, ev)
			}
		}
		s.Shifts = nil
		for _, sh := range c.Scenario.Shifts {
			if sh <= s.Duration {
				s.Shifts = append(s.Shifts, sh)
			}
		}
	}
	if err := s.Validate(); err != nil {
		return c, err
	}
	c.Scenario = &s
	if c.Allocator == nil {
		c.Allocator = &allocator.Params{Algorithm: allocator.MaxMinFair, MaxStep: 0.25, DeadBand: 0.01}
	}
	if err := c.Allocator.Validate(); err != nil {
		return c, fmt.Errorf("sim: %w", err)
	}
	if c.Protocol == "" {
		c.Protocol = TwoStep
	}
	if c.Protocol != TwoStep && c.Protocol != Naive {
		return c, fmt.Errorf("sim: unknown protocol %q (want %q or %q)", c.Protocol, TwoStep, Naive)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.RebalanceInterval, 5*time.Second)
	def(&c.ReportInterval, time.Second)
	def(&c.PropagationDelay, 300*time.Millisecond)
	def(&c.LeaseTTL, 10*time.Second)
	def(&c.SkewMargin, time.Second)
	if c.PropagationDelay < 0 {
		c.PropagationDelay = 0
	}
	for _, d := range []time.Duration{c.RebalanceInterval, c.ReportInterval, c.LeaseTTL, c.SkewMargin} {
		if d < time.Millisecond || d > MaxDuration {
			return c, fmt.Errorf("sim: interval %v out of range [1ms, %v]", d, MaxDuration)
		}
	}
	if c.Smoothing == 0 {
		c.Smoothing = 0.5
	}
	if c.MaxOverrides == 0 {
		c.MaxOverrides = 32
	}
	if c.SeriesBins == 0 {
		c.SeriesBins = 360
	}
	for _, p := range []float64{c.LostReports, c.LateReports} {
		if !(p >= 0 && p <= 1) {
			return c, fmt.Errorf("sim: probability %v outside [0, 1]", p)
		}
	}
	switch {
	case !(c.Smoothing > 0 && c.Smoothing <= 1):
		return c, fmt.Errorf("sim: smoothing %v outside (0, 1]", c.Smoothing)
	case !(c.MinShare >= 0) || c.MinShare*float64(s.Regions) > 1:
		return c, fmt.Errorf("sim: min share %v × %d regions above 1", c.MinShare, s.Regions)
	case c.MaxOverrides < 0 || c.MaxOverrides > 10_000:
		return c, fmt.Errorf("sim: max overrides %d outside [0, 10000]", c.MaxOverrides)
	case c.SeriesBins < 1 || c.SeriesBins > 100_000:
		return c, fmt.Errorf("sim: series bins %d outside [1, 100000]", c.SeriesBins)
	}
	return c, nil
}

// Figures are the measured outcome of one model on the request stream.
type Figures struct {
	Overshoot1s    float64 `json:"overshoot_1s"`
	Overshoot10s   float64 `json:"overshoot_10s"`
	Overshoot60s   float64 `json:"overshoot_60s"`
	UnderAdmission float64 `json:"under_admission"`
	Admitted       int64   `json:"admitted"`
}

// Series is admitted requests per second per region over time.
type Series struct {
	BinSeconds float64     `json:"bin_s"`
	Regions    [][]float64 `json:"regions"`
	Total      []float64   `json:"total"`
	Ideal      []float64   `json:"ideal"`
}

// Result is the outcome of one run.
type Result struct {
	Scenario           string  `json:"scenario"`
	RebalanceIntervalS float64 `json:"rebalance_interval_s"`
	ReportIntervalS    float64 `json:"report_interval_s"`
	Protocol           string  `json:"protocol"`
	Algorithm          string  `json:"algorithm"`
	Overcommit         float64 `json:"overcommit"`
	Seed               uint64  `json:"seed"`
	Regions            int     `json:"regions"`
	Subjects           int     `json:"subjects"`
	DurationS          float64 `json:"duration_s"`
	Figures
	IdealAdmitted int64 `json:"ideal_admitted"`
	Offered       int64 `json:"offered"`
	// MaxShareSum is the largest Σ over regions of the shares they enforced
	// at one instant, over all allocations (default and per subject).
	MaxShareSum float64 `json:"max_share_sum"`
	// ConvergenceS is, per scenario shift, the seconds until admitted over
	// 10 s reached 95% of the ideal bucket's again; −1 if never.
	ConvergenceS []float64 `json:"convergence_s"`
	Epochs       int       `json:"epochs"`
	// BucketCalls counts decisions asked of the in-memory buckets.
	BucketCalls int64              `json:"bucket_calls"`
	Baselines   map[string]Figures `json:"baselines,omitempty"`
	Series      *Series            `json:"series,omitempty"`
}

// Baseline names.
const (
	BaselineIdeal       = "ideal_global"
	BaselineIndependent = "independent_full"
	BaselineStaticEqual = "static_equal"
)

// allocation is one published epoch: a default share per region and
// per-subject overrides.
type allocation struct {
	epoch     int
	def       []float64
	overrides map[int32][]float64
}

func (a *allocation) share(region int, subject int32) float64 {
	if o, ok := a.overrides[subject]; ok {
		return o[region]
	}
	return a.def[region]
}

// event kinds inside the engine.
const (
	evReport = iota
	evReportArrive
	evRebalance
	evApply
	evAck
	evScenario
)

type event struct {
	at     time.Duration
	seq    int64
	kind   int
	region int
	alloc  *allocation
	rep    *report
	sc     Event
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// report is a region's demand report for one interval.
type report struct {
	offered  float64 // requests per second, all subjects
	subjects map[int32]float64
}

// model is one set of buckets deciding the stream: the simulated system or
// a baseline.
type model struct {
	stores   []*bucket.Memory // per region, or one
	share    func(region int, subject int32) float64
	win      *windows
	admitted int64
}

type engine struct {
	cfg     Config
	sc      *Scenario
	rng     *rand.Rand
	limits  bucket.Limits
	keys    []bucket.Key
	groups  []group
	n       int
	tick    time.Duration
	now     time.Duration
	seq     int64
	events  eventHeap
	up      []bool
	downAt  []time.Duration
	applied []*allocation
	calls   int64

	coordUp   bool
	published *allocation // latest grow (or naive) allocation
	pending   *allocation // two-step: the growth waiting for acks
	shrink    *allocation
	acked     []int
	epoch     int
	sOffered  []float64
	sSubject  map[int32][]float64
	pressured map[int32]bool
	maxSum    float64

	sys       *model
	baselines map[string]*model
	offered   int64

	// per-tick batches per region
	tickCnt     [][]int64
	tickTouched [][]int32
	retryOf     []int               // per subject: retries its clients make
	retryQ      []map[int32][]int64 // per region: subject → pending retries by attempt
	retryKeys   []int32
	// per-interval counters per region
	intOffered []int64
	subOffered [][]int64
	subDenied  [][]int64
	touched    [][]int32

	perSecondSys, perSecondIdeal []int64
	seriesRegion                 [][]float64
	seriesIdeal                  []float64
	binTicks                     int64
}

// Run simulates one configuration. It is deterministic: the same Config
// gives the same Result, byte for byte once encoded.
func Run(cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e, err := newEngine(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.run(); err != nil {
		return nil, err
	}
	return e.result(), nil
}

func newEngine(cfg Config) (*engine, error) {
	sc := cfg.Scenario
	n := sc.Regions
	e := &engine{
		cfg: cfg, sc: sc, n: n,
		rng:       rand.New(rand.NewPCG(cfg.Seed, 0x5eed51)),
		tick:      time.Duration(sc.Tick),
		up:        make([]bool, n),
		downAt:    make([]time.Duration, n),
		applied:   make([]*allocation, n),
		acked:     make([]int, n),
		coordUp:   true,
		sOffered:  make([]float64, n),
		sSubject:  map[int32][]float64{},
		pressured: map[int32]bool{},
		baselines: map[string]*model{},
		limits: bucket.Limits{Capacity: sc.Capacity, RefillPerSecond: sc.RefillPerSecond,
			IdleTTL:    time.Duration(float64(time.Second)*float64(sc.Capacity)/sc.RefillPerSecond) + time.Minute,
			Overcommit: cfg.Allocator.Overcommit},
		intOffered: make([]int64, n),
	}
	e.keys = make([]bucket.Key, sc.Subjects)
	for j := range e.keys {
		k, err := bucket.NewKey("sim", 1, fmt.Sprintf("s%07d", j))
		if err != nil {
			return nil, fmt.Errorf("sim: subject key: %w", err)
		}
		e.keys[j] = k
	}
	e.groups = compileGroups(sc, sc.Subjects)
	first := &allocation{def: make([]float64, n), overrides: map[int32][]float64{}}
	if cfg.InitialShares != nil && len(cfg.InitialShares) != n {
		return nil, fmt.Errorf("sim: %d initial shares for %d regions", len(cfg.InitialShares), n)
	}
	for i := range first.def {
		first.def[i] = (1 + cfg.Allocator.Overcommit) / float64(n)
		if cfg.InitialShares != nil {
			first.def[i] = cfg.InitialShares[i]
		}
		e.up[i] = true
		e.applied[i] = first
	}
	e.published = first
	e.tickCnt = make([][]int64, n)
	e.tickTouched = make([][]int32, n)
	e.retryQ = make([]map[int32][]int64, n)
	e.retryOf = make([]int, sc.Subjects)
	for _, g := range e.groups {
		for j := 0; j < g.n; j++ {
			e.retryOf[j] = max(e.retryOf[j], g.Retries)
		}
	}
	e.subOffered = make([][]int64, n)
	e.subDenied = make([][]int64, n)
	e.touched = make([][]int32, n)
	for i := 0; i < n; i++ {
		e.subOffered[i] = make([]int64, sc.Subjects)
		e.subDenied[i] = make([]int64, sc.Subjects)
		e.tickCnt[i] = make([]int64, sc.Subjects)
		e.retryQ[i] = map[int32][]int64{}
	}
	tickS := e.tick.Seconds()
	newModel := func(stores int, share func(int, int32) float64) (*model, error) {
		m := &model{share: share, win: newWindows(sc.Subjects, tickS, sc.Capacity, sc.RefillPerSecond)}
		for i := 0; i < stores; i++ {
			st, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: sc.Subjects + 16})
			if err != nil {
				return nil, fmt.Errorf("sim: bucket store: %w", err)
			}
			m.stores = append(m.stores, st)
		}
		return m, nil
	}
	var err error
	if e.sys, err = newModel(n, func(r int, j int32) float64 { return e.applied[r].share(r, j) }); err != nil {
		return nil, err
	}
	if !cfg.NoBaselines {
		specs := []struct {
			name   string
			stores int
			share  float64
		}{{BaselineIdeal, 1, 1}, {BaselineIndependent, n, 1}, {BaselineStaticEqual, n, 1 / float64(n)}}
		for _, s := range specs {
			share := s.share
			if e.baselines[s.name], err = newModel(s.stores, func(int, int32) float64 { return share }); err != nil {
				return nil, err
			}
		}
	}
	seconds := int(time.Duration(sc.Duration)/time.Second) + 1
	e.perSecondSys = make([]int64, seconds)
	e.perSecondIdeal = make([]int64, seconds)
	ticks := int64(time.Duration(sc.Duration) / e.tick)
	e.binTicks = max(1, (ticks+int64(cfg.SeriesBins)-1)/int64(cfg.SeriesBins))
	bins := int((ticks + e.binTicks - 1) / e.binTicks)
	e.seriesRegion = make([][]float64, n)
	for i := range e.seriesRegion {
		e.seriesRegion[i] = make([]float64, bins)
	}
	e.seriesIdeal = make([]float64, bins)
	e.checkSum()
	return e, nil
}

func (e *engine) push(ev *event) {
	e.seq++
	ev.seq = e.seq
	heap.Push(&e.events, ev)
}

// delay draws one message's propagation delay.
func (e *engine) delay() time.Duration {
	d := e.cfg.PropagationDelay
	return time.Duration(float64(d) * (0.5 + e.rng.Float64()))
}

func (e *engine) run() error {
	dur := time.Duration(e.sc.Duration)
	for i := 0; i < e.n; i++ {
		e.push(&event{at: e.cfg.ReportInterval, kind: evReport, region: i})
	}
	e.push(&event{at: e.cfg.RebalanceInterval, kind: evRebalance})
	for _, ev := range e.sc.Events {
		e.push(&event{at: time.Duration(ev.At), kind: evScenario, sc: ev})
	}
	ticks := int64(dur / e.tick)
	w := make([]float64, e.n)
	tickS := e.tick.Seconds()
	for t := int64(0); t < ticks; t++ {
		e.now = time.Duration(t) * e.tick
		for len(e.events) > 0 && e.events[0].at <= e.now {
			if err := e.handle(heap.Pop(&e.events).(*event)); err != nil {
				return err
			}
		}
		for r := 0; r < e.n; r++ {
			if !e.up[r] {
				clear(e.retryQ[r])
				continue
			}
			cnt, touched := e.tickCnt[r], e.tickTouched[r][:0]
			for gi := range e.groups {
				g := &e.groups[gi]
				g.weights(e.now, e.up, w)
				for k := poisson(e.rng, g.total*w[r]*tickS); k > 0; k-- {
					var j int
					if g.alias != nil {
						j = g.alias.sample(e.rng)
					} else {
						j = e.rng.IntN(g.n)
					}
					if cnt[j] == 0 {
						touched = append(touched, int32(j))
					}
					cnt[j]++
				}
			}
			// Subjects with retries pending but no fresh arrival.
			e.retryKeys = e.retryKeys[:0]
			for j := range e.retryQ[r] {
				if cnt[j] == 0 {
					e.retryKeys = append(e.retryKeys, j)
				}
			}
			sort.Slice(e.retryKeys, func(a, b int) bool { return e.retryKeys[a] < e.retryKeys[b] })
			touched = append(touched, e.retryKeys...)
			e.tickTouched[r] = touched
			for _, j := range touched {
				e.decide(r, t, j)
			}
		}
	}
	return nil
}

// decide runs one subject's batch of this tick in region r through the
// system and every baseline.
func (e *engine) decide(r int, t int64, j int32) {
	fresh := e.tickCnt[r][j]
	e.tickCnt[r][j] = 0
	hist := e.retryQ[r][j]
	n := fresh
	for _, h := range hist {
		n += h
	}
	if n == 0 {
		delete(e.retryQ[r], j)
		return
	}
	e.offered += n
	a := e.take(e.sys, r, r, t, j, n)
	if e.perSecondSys != nil {
		sec := int(e.now / time.Second)
		e.perSecondSys[sec] += a
		e.seriesRegion[r][t/e.binTicks] += float64(a)
	}
	for name, m := range e.baselinesOrdered() {
		store := r
		if len(m.stores) == 1 {
			store = 0
		}
		b := e.take(m, r, store, t, j, n)
		if name == 0 {
			e.perSecondIdeal[int(e.now/time.Second)] += b
			e.seriesIdeal[t/e.binTicks] += float64(b)
		}
	}
	d := n - a
	if e.subOffered[r][j] == 0 {
		e.touched[r] = append(e.touched[r], j)
	}
	e.subOffered[r][j] += n
	e.subDenied[r][j] += d
	e.intOffered[r] += n
	R := e.retryOf[j]
	if R == 0 {
		return
	}
	// Admitted requests are the oldest: retries by attempt, highest first.
	if hist == nil {
		hist = make([]int64, R+1)
	}
	left := a
	next := make([]int64, R+1)
	for at := R; at >= 1; at-- {
		take := min(left, hist[at])
		left -= take
		if den := hist[at] - take; den > 0 && at < R {
			next[at+1] += den
		}
	}
	if den := fresh - min(left, fresh); den > 0 {
		next[1] += den
	}
	any := false
	for _, v := range next {
		any = any || v > 0
	}
	if any {
		e.retryQ[r][j] = next
	} else {
		delete(e.retryQ[r], j)
	}
}

// baselinesOrdered returns the baselines in a fixed order; index 0 is the
// ideal global bucket.
func (e *engine) baselinesOrdered() []*model {
	if len(e.baselines) == 0 {
		return nil
	}
	return []*model{e.baselines[BaselineIdeal], e.baselines[BaselineIndependent], e.baselines[BaselineStaticEqual]}
}

// take decides n unit requests of subject j arriving together: exactly as
// n requests of cost 1 one after the other, it admits min(n, ⌊tokens⌋).
func (e *engine) take(m *model, r, store int, t int64, j int32, n int64) int64 {
	share := m.share(r, j)
	if share <= 0 {
		return 0
	}
	now := time.Unix(0, 0).Add(e.now)
	req := bucket.Request{Key: e.keys[j], Limits: e.limits, Share: share, Cost: n}
	e.calls++
	d, err := m.stores[store].TakeAt(now, req)
	a := int64(0)
	switch {
	case err != nil:
		// Cannot happen with validated limits; count as denied.
	case d.Allowed:
		a = n
	default:
		if k := int64(math.Floor(d.Remaining + 1e-9)); k > 0 {
			req.Cost = min(k, n)
			e.calls++
			if d2, err := m.stores[store].TakeAt(now, req); err == nil && d2.Allowed {
				a = req.Cost
			}
		}
	}
	if a > 0 {
		m.admitted += a
		m.win.add(int(j), t, a)
	}
	return a
}
