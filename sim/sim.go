package sim

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/plan"
)

// Protocol is how the coordinator publishes a new allocation
// (plan.Protocol).
type Protocol = plan.Protocol

// The protocols.
const (
	// TwoStep publishes min(old, new) first and the new shares only after
	// every live region acknowledged the shrink.
	TwoStep = plan.TwoStep
	// Naive publishes the new shares at once; regions apply them at
	// different moments, so Σ shares may exceed 1 + ε for a while.
	Naive = plan.Naive
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
	// Smoothing is the α of the demand average, applied once per
	// rebalance round as the coordinator does (plan.Params.Alpha).
	// Default 0.5.
	Smoothing float64
	// MinShare is every region's guaranteed minimum. Default 0.
	MinShare float64
	// MaxOverrides bounds the subjects with their own allocation, and the
	// pressured subjects a report carries. Default 32.
	MaxOverrides int
	// OverrideRounds is how many rebalance rounds without a report of
	// pressure a subject keeps its demand, and so its override
	// (plan.Params.OverrideRounds). Default 3.
	OverrideRounds int
	// SeriesBins is the number of points of the per-region series.
	// Default 360.
	SeriesBins int
	// InitialShares is the default allocation in force at the start;
	// nil means an equal split of 1 + ε.
	InitialShares []float64
	// proposed, when set, is published at every rebalance instead of a
	// split (PredictOvershoot).
	proposed []float64
	// probeAlways reads the tokens left after every fully admitted batch
	// from the bucket, without the shortcuts (a test holds them to it).
	probeAlways bool
	// NoShareRules decides as nodes did before their rules on shares
	// that grew: a token bucket a region creates starts full at the
	// current share, not at the lowest share the region held over the
	// last refill time, and a window's count is charged at the current
	// share, not at the lowest since the window began. It shows what the
	// rules prevent; nodes always apply them.
	NoShareRules bool
	// Baselines also runs the three baseline models on the same stream.
	// Default true (set NoBaselines to skip them).
	NoBaselines bool
	// Admitted, when set, is called with every batch the simulated system
	// admits (not the baselines'), in time order: the decisions a checker
	// of the bound (internal/boundcheck) reads, as it reads a live run's.
	// nil, the default, records nothing. Sweep calls it from the
	// goroutine that runs the Config.
	Admitted func(RegionAdmission)
}

// RegionAdmission is a batch the simulated system admitted: Count unit
// requests of subject Subject (SubjectID names it) in region Region
// (RegionName) at At, the time since the run's start (the Unix epoch).
type RegionAdmission struct {
	At      time.Duration
	Region  int
	Subject int
	Count   int64
}

// RegionName is the name the simulator gives region r (0 ≤ r <
// MaxScenarioRegions) in the allocations it publishes.
func RegionName(r int) string { return regionName(r) }

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
	if c.OverrideRounds == 0 {
		c.OverrideRounds = 3
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
	case c.MaxOverrides < 0 || c.MaxOverrides > plan.MaxOverridesLimit:
		return c, fmt.Errorf("sim: max overrides %d outside [0, %d]", c.MaxOverrides, plan.MaxOverridesLimit)
	case c.OverrideRounds < 1 || c.OverrideRounds > 10_000:
		return c, fmt.Errorf("sim: override rounds %d outside [1, 10000]", c.OverrideRounds)
	case c.SeriesBins < 1 || c.SeriesBins > 100_000:
		return c, fmt.Errorf("sim: series bins %d outside [1, 100000]", c.SeriesBins)
	}
	return c, nil
}

// Figures are the measured outcome of one model on the request stream.
type Figures struct {
	Overshoot1s  float64 `json:"overshoot_1s"`
	Overshoot10s float64 `json:"overshoot_10s"`
	Overshoot60s float64 `json:"overshoot_60s"`
	// OvershootWindow, for a window algorithm, is max over the policy's
	// aligned windows of admitted/C − 1, floored at 0: what the regions
	// together admitted in one window beyond its budget.
	OvershootWindow float64 `json:"overshoot_window,omitempty"`
	UnderAdmission  float64 `json:"under_admission"`
	Admitted        int64   `json:"admitted"`
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
	// NoShareRules is Config.NoShareRules: the run decided without the
	// nodes' rules on shares that grew.
	NoShareRules bool    `json:"no_share_rules,omitempty"`
	Algorithm    string  `json:"algorithm"`
	Overcommit   float64 `json:"overcommit"`
	Seed         uint64  `json:"seed"`
	Regions      int     `json:"regions"`
	Subjects     int     `json:"subjects"`
	DurationS    float64 `json:"duration_s"`
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
	// BucketCalls counts the bucket decisions the system (not the baselines) asked for.
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
	evRecheck
	evLeaseEnd
)

type event struct {
	at     time.Duration
	seq    int64
	kind   int
	region int
	alloc  *allocation
	rep    *report
	sc     Event
	gen    int  // evRebalance: the leader term that scheduled it
	once   bool // evRebalance: a round off the ticker, which schedules no next
	node   int  // evAck: the region's node that acknowledges (simNode.seq)
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
	interval int64    // the region's report interval it covers, from 1
	offered  float64  // requests per second, all subjects
	subjects []demand // the pressured subjects, most pressured first, at most MaxOverrides
}

// demand is a subject's pressured offered rate in a report, requests per
// second.
type demand struct {
	j int32
	v float64
}

// model is one set of buckets deciding the stream: the simulated system or
// a baseline. It holds one bucket.TokenState per store (region, or one
// global) and subject: the decision code of bucket.State and bucket.Memory
// for a token bucket, 32 bytes per bucket.
type model struct {
	states   [][]bucket.TokenState // per store, per subject; nil for the system (its buckets are in engine.sub)
	wstates  [][]bucket.State      // the same for a window algorithm (the system's included)
	aligned  *alignedWindows       // window algorithms: counts per aligned window
	win      *windows
	admitted int64
	calls    int64       // decisions the batches would ask of a Store (batchCalls)
	lim      shareLimits // a baseline's limits (its share never changes)
}

// shareLimits holds the bucket limits at the share last asked for, so
// that they are converted only when the share changes (engine.take).
type shareLimits struct {
	share float64 // 0: none yet
	lim   bucket.TokenLimits
	half  int64 // ⌈f·C/2⌉: fewer whole tokens left is pressure
	whole int64 // ⌊f·C⌋, the whole tokens of a full bucket; −1 when f·C is within 0.001 of a whole number
}

// newModel returns a model with room for queue admissions in its window
// queue before it grows.
func newModel(stores, subjects int, widths []int64, limits []float64, queue int) *model {
	m := &model{states: make([][]bucket.TokenState, stores), win: newWindows(subjects, widths, limits)}
	m.win.queue = make([]mark, 0, queue)
	for i := range m.states {
		m.states[i] = make([]bucket.TokenState, subjects)
	}
	return m
}

// windowed makes m decide a window algorithm in stores stores (for the
// system, one per region) and count per aligned window of width ticks.
func (m *model) windowed(stores, subjects int, width int64) *model {
	m.states = nil
	m.wstates = make([][]bucket.State, stores)
	for i := range m.wstates {
		m.wstates[i] = make([]bucket.State, subjects)
	}
	m.aligned = newAlignedWindows(subjects, width)
	return m
}

// baseRun is what the three baselines found on one request stream, for
// some of the subjects. For the subjects whose clients do not retry it
// depends on the stream alone, so Sweep computes that part once and shares
// it between runs (rebalance intervals, protocols); each run decides the
// subjects that retry (their stream holds the system's denials) and merges
// the two (subjects' buckets and windows are independent: admitted counts
// add up, overshoot takes the larger best count).
type baseRun struct {
	ideal, independent, static *model
	perSecondIdeal             []int64
	seriesIdeal                []float64
}

// subjectRegion is what the engine keeps per subject and region, the
// system's bucket included, together so that a decision touches one or two
// adjacent cache lines for it (64 bytes).
type subjectRegion struct {
	ovr       float64           // the applied override share; NaN: the region's default
	st        bucket.TokenState // the system's bucket
	pressured int64             // pressured requests in interval
	interval  int32             // the report interval pressured counts in
	lastAt    int32             // 1 + the tick of the last decision; 0: none
	// floor is a lower bound of the whole tokens in st when it was taken,
	// at the region's shareGen floorGen (0: none): refill only adds tokens
	// and only a lower share takes them away, down to its capacity. The
	// bound holds, lowered to the lowest default capacity since then
	// (engine.fallMin), for floorGens falls of the default; setApplied
	// zeroes floorGen when a subject's own share falls.
	floor    int32
	floorGen uint32
}

// fullAfter is the ticks after which a bucket left alone is full whatever
// its share: f·C refills at f·r in C/r, and the bucket refills the whole
// time since its last write at the share it is read at (one tick more
// for rounding).
func fullAfter(capacity int64, refill float64, tick time.Duration) int64 {
	return int64(min(math.Ceil(float64(capacity)/refill/tick.Seconds())+1, math.MaxInt32))
}

type engine struct {
	cfg      Config
	sc       *Scenario
	rng      *rand.Rand // control plane only; arrivals have their own
	stream   *stream
	prep     bucket.Prepared
	capacity int64
	maxShare float64
	n        int
	tick     time.Duration
	now      time.Duration
	nowUs    int64 // now in Unix microseconds (a run starts at the Unix epoch)
	seq      int64
	events   eventHeap
	up       []bool
	downAt   []time.Duration
	applied  []*allocation
	defShare []float64 // per region: the default share of applied[r]
	shareGen []uint32  // per region: counts the falls of its default share, from 1
	full     int64     // fullAfter for the scenario
	// fallMin is per region, at g mod floorGens, the lowest default share
	// since shareGen g (+Inf: none), for the last floorGens gens.
	fallMin   [][floorGens]float64
	defLim    []shareLimits
	ovrLim    [][ovrSlots]shareLimits // per region: limits at override shares, by ovrSlot
	sec, bin  int                     // the current second and series bin
	stamp     []uint64                // per subject: marks of set membership (nextStamp)
	stampSeq  uint64
	err       error
	warmSink  int64 // the sum of what warm read, so that its loads are kept
	converted int64 // the limits setLimits converted (a test counts them)

	// The coordinator: the planner's state while a leader leads (nil
	// while none does), its rules, the scenario's policy and controls, and
	// the allocation record it published last.
	leader   *plan.Leader
	params   plan.Params
	policy   plan.Policy
	control  plan.Control
	current  *plan.Allocation
	term     int         // leader terms: a coordinator's return starts a new one
	rechecks bool        // an evRecheck is pending
	regs     [][]simNode // per region: its nodes' registrations, oldest first
	latest   []*report   // per region: the latest report that arrived (what etcd holds)
	v        *plan.View  // the coordinator's view, updated in place (engine.view)
	viewed   []*report   // per region: the report in v
	names    map[int32]string
	upAt     []time.Duration // per region: when it last came back (0: up from the start)
	maxSum   float64

	// The nodes' rules on shares that grew need each region's applied
	// allocations over the last full refill time (token bucket: a bucket
	// the region creates starts at the lowest share it held in that
	// time) or during the longest time a window count can span (window
	// algorithms: a count is charged at the lowest share held then,
	// bucket.Limits.CountedFor).
	windowed   bool
	shareHist  [][]appliedAt             // per region, oldest first
	lows       []lowShares               // per region: what lowShare keeps
	windowRule bool                      // apply the window rule (a test turns it off)
	fillRule   bool                      // apply the fill rule (a test turns it off)
	refill     time.Duration             // the full refill time C/r the fill rule looks back over
	defGrewAt  []time.Duration           // per region: when its default share last grew (−refill: never)
	ownGrewAt  []map[int32]time.Duration // per region: when a subject's own share grew, within the last refill time
	fillLim    []fillLimits              // per region: the limits of the last bucket it created below full

	sys      *model   // nil when only the baselines run
	base     *baseRun // baselines shared from a pass over the same stream, or nil
	own      *baseRun // baselines decided here, for the subjects ownSel picks, or nil
	ownSel   int
	offered  int64
	windowsW []int64
	windowsL []float64

	// retries of clients that ignore Retry-After, per region
	retryOf   []int     // per subject: retries its clients make
	maxRetry  int       // max of retryOf
	retry     [][]int64 // per region: subject j's pending retries by attempt at [j*(maxRetry+1)+a]
	retryList [][]int32 // per region: subjects that may have retries pending
	listed    [][]bool
	freshAt   []int64 // per subject: 1 + the tick·regions+region it last had fresh arrivals
	retryKeys []int32
	nextRetry []int64
	// per-interval counters per region
	intOffered []int64
	sub        [][]subjectRegion // per region and subject
	interval   []int64           // per region: the report interval, from 1
	pressuredJ [][]int32         // per region: subjects with pressured requests this interval
	cands      []demandCount     // collect's most pressured subjects (reused)

	perSecondSys []int64
	seriesRegion [][]float64
	binTicks     int64
}

// Which subjects an engine's own baselines decide.
const (
	ownAll      = iota
	ownRetrying // subjects whose clients retry (the rest are shared)
	ownSettled  // subjects whose clients do not retry (a shared pass)
)

// Run simulates one configuration. It is deterministic: the same Config
// gives the same Result, byte for byte once encoded.
func Run(cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return run(cfg, nil, nil, true)
}

// runPass decides cfg's baselines for the subjects whose clients do not
// retry, and records cfg's stream when it is within the bounds (nil
// otherwise), for the runs of that stream to share (run's base and rec).
func runPass(cfg Config) (*baseRun, *recording, error) {
	e, err := newEngine(cfg, nil, false)
	if err != nil {
		return nil, nil, err
	}
	e.ownSel = ownSettled
	e.stream.tape = newRecording(e.sc)
	if err := e.run(); err != nil {
		return nil, nil, err
	}
	if rec := e.stream.tape; rec != nil && rec.ok {
		return e.own, rec, nil
	}
	return e.own, nil, nil
}

// run simulates cfg (already defaulted). base, when not nil, is the
// baselines of cfg's stream for the subjects that do not retry, and rec,
// when not nil, the stream itself (runPass); sys false runs only the
// baselines.
func run(cfg Config, base *baseRun, rec *recording, sys bool) (*Result, error) {
	e, err := newEngine(cfg, base, sys)
	if err != nil {
		return nil, err
	}
	e.stream.replay = rec
	if err := e.run(); err != nil {
		return nil, err
	}
	return e.result(), nil
}

func newEngine(cfg Config, base *baseRun, sys bool) (*engine, error) {
	sc := cfg.Scenario
	n := sc.Regions
	prep, err := bucket.Prepare(sc.limits(cfg.Allocator.Overcommit))
	if err != nil {
		return nil, fmt.Errorf("sim: scenario %q limits: %w", sc.Name, err)
	}
	e := &engine{
		cfg: cfg, sc: sc, n: n, prep: prep, capacity: sc.Capacity, maxShare: 1 + cfg.Allocator.Overcommit,
		rng:        rand.New(rand.NewPCG(cfg.Seed, 0x5eed51)),
		stream:     newStream(sc, cfg.Seed),
		tick:       time.Duration(sc.Tick),
		full:       fullAfter(sc.Capacity, sc.RefillPerSecond, time.Duration(sc.Tick)),
		up:         make([]bool, n),
		downAt:     make([]time.Duration, n),
		applied:    make([]*allocation, n),
		defShare:   make([]float64, n),
		shareGen:   make([]uint32, n),
		fallMin:    make([][floorGens]float64, n),
		defLim:     make([]shareLimits, n),
		ovrLim:     make([][ovrSlots]shareLimits, n),
		sub:        make([][]subjectRegion, n),
		regs:       make([][]simNode, n),
		names:      map[int32]string{},
		latest:     make([]*report, n),
		upAt:       make([]time.Duration, n),
		intOffered: make([]int64, n),
		base:       base,
	}
	tickS := e.tick.Seconds()
	for _, s := range windowSeconds {
		e.windowsW = append(e.windowsW, int64(s/tickS+0.5))
		e.windowsL = append(e.windowsL, sc.mostAdmitted(s))
	}
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
		e.sub[i] = make([]subjectRegion, sc.Subjects)
		for j := range e.sub[i] {
			e.sub[i][j].ovr = math.NaN()
		}
		e.applied[i] = first
		e.defShare[i] = first.def[i]
		e.shareGen[i] = 1
		e.fallMin[i][1] = math.Inf(1)
	}
	if err := e.coordinator(first); err != nil {
		return nil, err
	}
	e.retryOf = make([]int, sc.Subjects)
	for _, g := range compileGroups(sc, sc.Subjects) {
		for j := g.First; j < g.First+g.n; j++ {
			e.retryOf[j] = max(e.retryOf[j], g.Retries)
			e.maxRetry = max(e.maxRetry, g.Retries)
		}
	}
	e.retry = make([][]int64, n)
	e.retryList = make([][]int32, n)
	e.listed = make([][]bool, n)
	if e.maxRetry > 0 {
		for i := 0; i < n; i++ {
			e.retry[i] = make([]int64, sc.Subjects*(e.maxRetry+1))
			e.listed[i] = make([]bool, sc.Subjects)
		}
		e.freshAt = make([]int64, sc.Subjects)
		e.nextRetry = make([]int64, e.maxRetry+1)
	}
	e.interval = make([]int64, n)
	for i := range e.interval {
		e.interval[i] = 1
	}
	e.pressuredJ = make([][]int32, n)
	e.stamp = make([]uint64, sc.Subjects)
	room := e.queueRoom()
	e.windowed = sc.windowed()
	width := int64(time.Duration(sc.Window) / e.tick)
	if sys {
		e.sys = newModel(0, sc.Subjects, e.windowsW, e.windowsL, room)
		e.shareHist = make([][]appliedAt, n)
		e.lows = make([]lowShares, n)
		for r := range e.shareHist {
			e.shareHist[r] = []appliedAt{{at: 0, a: e.applied[r]}}
			e.lows[r].held = make([]int32, sc.Subjects)
			e.holdOverrides(r, e.applied[r], 1)
		}
		if e.windowed {
			e.sys.windowed(n, sc.Subjects, width)
			e.windowRule = !cfg.NoShareRules
		} else {
			e.fillRule = !cfg.NoShareRules
			e.refill = time.Duration(float64(sc.Capacity) / sc.RefillPerSecond * float64(time.Second))
			e.defGrewAt = make([]time.Duration, n)
			e.ownGrewAt = make([]map[int32]time.Duration, n)
			for r := range e.defGrewAt {
				e.defGrewAt[r] = -e.refill
				e.ownGrewAt[r] = map[int32]time.Duration{}
			}
			e.fillLim = make([]fillLimits, n)
		}
	}
	seconds := int(time.Duration(sc.Duration)/time.Second) + 1
	ticks := int64(time.Duration(sc.Duration) / e.tick)
	e.binTicks = max(1, (ticks+int64(cfg.SeriesBins)-1)/int64(cfg.SeriesBins))
	bins := int((ticks + e.binTicks - 1) / e.binTicks)
	if base != nil {
		e.ownSel = ownRetrying
	}
	if !cfg.NoBaselines && (base == nil || e.maxRetry > 0) {
		e.own = &baseRun{
			ideal:          newModel(1, sc.Subjects, e.windowsW, e.windowsL, room),
			independent:    newModel(n, sc.Subjects, e.windowsW, e.windowsL, room),
			static:         newModel(n, sc.Subjects, e.windowsW, e.windowsL, room),
			perSecondIdeal: make([]int64, seconds),
			seriesIdeal:    make([]float64, bins),
		}
		if e.windowed {
			e.own.ideal.windowed(1, sc.Subjects, width)
			e.own.independent.windowed(n, sc.Subjects, width)
			e.own.static.windowed(n, sc.Subjects, width)
		}
	}
	e.perSecondSys = make([]int64, seconds)
	e.seriesRegion = make([][]float64, n)
	for i := range e.seriesRegion {
		e.seriesRegion[i] = make([]float64, bins)
	}
	e.checkSum()
	return e, nil
}

// coordinator sets up the control plane: one node registered per region,
// the allocation first in force (epoch 0), and a leader that has led since
// before the start.
func (e *engine) coordinator(first *allocation) error {
	c := e.cfg
	e.params = plan.Params{
		Algorithm: c.Allocator.Algorithm, MaxStep: c.Allocator.MaxStep, DeadBand: c.Allocator.DeadBand,
		Alpha: c.Smoothing, Protocol: c.Protocol, MaxOverrides: c.MaxOverrides, OverrideRounds: c.OverrideRounds,
		SkewMargin: c.SkewMargin,
	}
	e.policy = plan.Policy{Name: e.sc.Name, Rate: e.sc.RefillPerSecond, Overcommit: c.Allocator.Overcommit, DefaultMinShare: c.MinShare}
	e.current = &plan.Allocation{Policy: e.policy.Name, Phase: plan.PhaseStable,
		Default: make(map[string]float64, e.n), Safe: make(map[string]float64, e.n), Overcommit: c.Allocator.Overcommit}
	for r := 0; r < e.n; r++ {
		e.register(r)
		e.current.Default[regionName(r)] = first.def[r]
		e.current.Safe[regionName(r)] = c.MinShare
	}
	if c.proposed != nil {
		// A dry run's proposal is an operator's pin of every region.
		e.control.Pins = make(map[string]float64, e.n)
		for r, s := range c.proposed {
			e.control.Pins[regionName(r)] = s
		}
	}
	return e.lead(-c.SkewMargin)
}

// queueRoom is the room a model's window queue starts with: the mean
// arrivals within the longest window, twice (the queue compacts when half
// of it has left every window), bounded by 2^20 marks (24 MiB); the queue
// grows past it if it must.
func (e *engine) queueRoom() int {
	rate := 0.0
	for _, g := range compileGroups(e.sc, e.sc.Subjects) {
		rate += g.total
	}
	return int(min(2.2*rate*windowSeconds[len(windowSeconds)-1], 1<<20))
}

// setApplied makes a the allocation region r enforces.
func (e *engine) setApplied(r int, a *allocation) {
	// A share that grows takes no tokens away, so only a lower share
	// voids a floor: the region's default (every floor of the region), or
	// one subject's.
	sub, oldDef, newDef := e.sub[r], e.defShare[r], a.def[r]
	if newDef > oldDef && e.defGrewAt != nil {
		e.defGrewAt[r] = e.now
	}
	if newDef < oldDef {
		e.shareGen[r]++
		fm := &e.fallMin[r]
		for k := range fm {
			fm[k] = min(fm[k], newDef)
		}
		fm[e.shareGen[r]%floorGens] = math.Inf(1)
	}
	for j := range e.applied[r].overrides {
		if _, ok := a.overrides[j]; !ok {
			if newDef < sub[j].ovr {
				sub[j].floorGen = 0
			}
			if newDef > sub[j].ovr {
				e.ownGrew(r, j)
			}
			sub[j].ovr = math.NaN()
		}
	}
	for j, o := range a.overrides {
		prev := sub[j].ovr
		if prev != prev { // NaN: it had the default
			prev = oldDef
		}
		if o[r] < prev {
			sub[j].floorGen = 0
		}
		if o[r] > prev {
			e.ownGrew(r, j)
		}
		sub[j].ovr = o[r]
	}
	e.applied[r] = a
	e.defShare[r] = newDef
	if e.shareHist != nil {
		e.recordApplied(r, a)
	}
	if e.ownGrewAt != nil {
		for j, at := range e.ownGrewAt[r] {
			if e.now-at >= e.refill {
				delete(e.ownGrewAt[r], j)
			}
		}
	}
}

// ownGrew records that subject j's own share (its override, or the
// default it fell back to) in region r grew now.
func (e *engine) ownGrew(r int, j int32) {
	if e.ownGrewAt != nil {
		e.ownGrewAt[r][j] = e.now
	}
}

// grewLately says a share of region r that subject j may hold grew
// within the last refill time: its default, or j's own. Only then can a
// bucket the region creates for j start below its current share.
func (e *engine) grewLately(r int, j int32) bool {
	if e.now-e.defGrewAt[r] < e.refill {
		return true
	}
	m := e.ownGrewAt[r]
	if len(m) == 0 {
		return false
	}
	at, ok := m[j]
	return ok && e.now-at < e.refill
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
	if e.sys != nil {
		for i := 0; i < e.n; i++ {
			e.push(&event{at: e.cfg.ReportInterval, kind: evReport, region: i})
		}
		e.push(&event{at: e.cfg.RebalanceInterval, kind: evRebalance})
	}
	for _, ev := range e.sc.Events {
		e.push(&event{at: time.Duration(ev.At), kind: evScenario, sc: ev})
	}
	ticks := int64(dur / e.tick)
	epoch := time.Unix(0, 0)
	for t := int64(0); t < ticks; t++ {
		e.now = time.Duration(t) * e.tick
		e.nowUs = epoch.Add(e.now).UnixMicro()
		e.sec, e.bin = int(e.now/time.Second), int(t/e.binTicks)
		for len(e.events) > 0 && e.events[0].at <= e.now {
			if err := e.handle(heap.Pop(&e.events).(*event)); err != nil {
				return err
			}
		}
		e.stream.next(t)
		for r := 0; r < e.n; r++ {
			if !e.up[r] {
				e.clearRetries(r)
				continue
			}
			fresh := e.stream.out[r]
			e.warm(r, fresh, nil)
			if e.maxRetry == 0 {
				for _, b := range fresh {
					e.decide(r, t, b.subject, b.n)
				}
				continue
			}
			stamp := t*int64(e.n) + int64(r) + 1
			for _, b := range fresh {
				e.freshAt[b.subject] = stamp
			}
			// Subjects with retries pending but no fresh arrival come after
			// the fresh ones, in subject order.
			keys, list := e.retryKeys[:0], e.retryList[r][:0]
			for _, j := range e.retryList[r] {
				if !e.pendingRetries(r, j) {
					e.listed[r][j] = false
					continue
				}
				list = append(list, j)
				if e.freshAt[j] != stamp {
					keys = append(keys, j)
				}
			}
			e.retryList[r] = list
			slices.Sort(keys)
			e.retryKeys = keys
			e.warm(r, nil, keys)
			for _, b := range fresh {
				e.decide(r, t, b.subject, b.n)
			}
			for _, j := range keys {
				e.decide(r, t, j, 0)
			}
		}
		if e.err != nil {
			return e.err
		}
	}
	return nil
}

// warm reads a word of each place that deciding the subjects of fresh
// and of keys in region r writes: their records, window counters, pending
// retries and retry counts, the baselines' buckets. Deciding one batch waits for
// its subject's lines to come from memory (the arrays are larger than the
// cache); warming a tick's subjects first, in loops of loads that depend
// on nothing, lets the processor fetch many lines at once.
func (e *engine) warm(r int, fresh []batch, keys []int32) {
	var v int64
	if e.sys != nil {
		sub, win := e.sub[r], e.sys.win
		for _, b := range fresh {
			v += int64(sub[b.subject].lastAt) + win.counted(b.subject)
		}
		for _, j := range keys {
			v += int64(sub[j].lastAt) + win.counted(j)
		}
	}
	if e.maxRetry > 0 {
		rows, w := e.retry[r], e.maxRetry+1
		for _, b := range fresh {
			v += rows[int(b.subject)*w] + int64(e.retryOf[b.subject])
		}
	}
	if o := e.own; o != nil && o.ideal.states != nil {
		for _, m := range [...]*model{o.ideal, o.independent, o.static} {
			sts := m.states[min(r, len(m.states)-1)]
			for _, b := range fresh {
				if sts[b.subject].ShareGrew(&m.lim.lim) {
					v++
				}
				v += m.win.counted(b.subject)
			}
		}
	}
	e.warmSink += v
}

// retries returns subject j's pending retries in region r by attempt
// (index 1..maxRetry), or nil when no group retries.
func (e *engine) retries(r int, j int32) []int64 {
	if e.maxRetry == 0 {
		return nil
	}
	w := e.maxRetry + 1
	return e.retry[r][int(j)*w : (int(j)+1)*w]
}

func (e *engine) pendingRetries(r int, j int32) bool {
	for _, v := range e.retries(r, j) {
		if v > 0 {
			return true
		}
	}
	return false
}

// clearRetries drops region r's pending retries (the region is down).
func (e *engine) clearRetries(r int) {
	for _, j := range e.retryList[r] {
		clear(e.retries(r, j))
		e.listed[r][j] = false
	}
	e.retryList[r] = e.retryList[r][:0]
}

// decide runs one subject's batch of this tick in region r (fresh
// arrivals plus pending retries) through the system and, when they are
// decided here, the baselines.
func (e *engine) decide(r int, t int64, j int32, fresh int64) {
	hist := e.retries(r, j)
	n := fresh
	for _, h := range hist {
		n += h
	}
	if n == 0 {
		return
	}
	e.offered += n
	sr := &e.sub[r][j]
	a, p := n, int64(0)
	if e.sys != nil && e.windowed {
		a, p = e.takeWindow(e.sys, &e.sys.wstates[r][j], e.windowShare(r, j), t, j, n)
		if e.cfg.Admitted != nil {
			e.admitted(r, j, a)
		}
		e.perSecondSys[e.sec] += a
		e.seriesRegion[r][e.bin] += float64(a)
	} else if e.sys != nil {
		share, lim := sr.ovr, &e.defLim[r]
		if share != share { // NaN: the region's default
			share = e.defShare[r]
		} else {
			lim = &e.ovrLim[r][ovrSlot(share)]
		}
		// A bucket the region creates after a share of it grew starts at
		// the lowest share it held over the last refill time.
		below := false
		if e.fillRule && e.limitsAt(lim, share) && !sr.st.Stored(e.nowUs, &lim.lim) && e.grewLately(r, j) {
			if low := e.lowShare(r, j, e.now-e.refill); low < share {
				lim, below = e.fillLimits(r, share, low), true
			}
		}
		// Left alone long enough to be full, unless the share grew since
		// its last write (then full only to the old capacity) or the
		// bucket starts now below full.
		full := !below && (sr.lastAt == 0 || t-int64(sr.lastAt-1) >= e.full) &&
			!(e.limitsAt(lim, share) && sr.st.ShareGrew(&lim.lim))
		sr.lastAt = int32(t + 1)
		a = e.take(e.sys, &sr.st, lim, share, t, j, n)
		if e.cfg.Admitted != nil {
			e.admitted(r, j, a)
		}
		e.perSecondSys[e.sec] += a
		e.seriesRegion[r][e.bin] += float64(a)
		p = e.pressured(sr, r, lim, share, full, n, a)
	}
	if o := e.own; o != nil && e.windowed && e.ownDecides(j) {
		b, _ := e.takeWindow(o.ideal, &o.ideal.wstates[0][j], 1, t, j, n)
		o.perSecondIdeal[e.sec] += b
		o.seriesIdeal[e.bin] += float64(b)
		e.takeWindow(o.independent, &o.independent.wstates[r][j], 1, t, j, n)
		e.takeWindow(o.static, &o.static.wstates[r][j], 1/float64(e.n), t, j, n)
	} else if o := e.own; o != nil && e.ownDecides(j) {
		b := e.take(o.ideal, &o.ideal.states[0][j], &o.ideal.lim, 1, t, j, n)
		o.perSecondIdeal[e.sec] += b
		o.seriesIdeal[e.bin] += float64(b)
		e.take(o.independent, &o.independent.states[r][j], &o.independent.lim, 1, t, j, n)
		e.take(o.static, &o.static.states[r][j], &o.static.lim, 1/float64(e.n), t, j, n)
	}
	if e.sys == nil {
		return
	}
	if p > 0 {
		if iv := int32(e.interval[r]); sr.interval != iv { // first pressure of the interval
			sr.interval, sr.pressured = iv, 0
		}
		if sr.pressured == 0 {
			e.pressuredJ[r] = append(e.pressuredJ[r], j)
		}
		sr.pressured += p
	}
	e.intOffered[r] += n
	if e.maxRetry == 0 {
		return
	}
	R := e.retryOf[j]
	if R == 0 {
		return
	}
	// Admitted requests are the oldest: retries by attempt, highest first.
	next := e.nextRetry
	clear(next)
	left := a
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
	copy(hist, next)
	if !e.listed[r][j] && e.pendingRetries(r, j) {
		e.listed[r][j] = true
		e.retryList[r] = append(e.retryList[r], j)
	}
}

// ownDecides says the engine's own baselines decide subject j (ownSel).
// Without a retrying group no subject retries: retryOf is not read.
func (e *engine) ownDecides(j int32) bool {
	return e.ownSel == ownAll || (e.maxRetry > 0 && e.retryOf[j] > 0) == (e.ownSel == ownRetrying)
}

// admitted reports a batch of a requests of subject j that the system
// admitted in region r now to Config.Admitted (set: the caller checks,
// so that a run without it pays no call).
func (e *engine) admitted(r int, j int32, a int64) {
	if a > 0 {
		e.cfg.Admitted(RegionAdmission{At: e.now, Region: r, Subject: int(j), Count: a})
	}
}

// take decides n unit requests of subject j arriving together in m's
// bucket st at share (one after the other: bucket.TokenState.TakeUnitsAt),
// with the limits memoised in lim. A share above 1+ε (float rounding in
// the allocator) is clamped to it.
func (e *engine) take(m *model, st *bucket.TokenState, lim *shareLimits, share float64, t int64, j int32, n int64) int64 {
	if !e.limitsAt(lim, share) {
		return 0
	}
	a, err := st.TakeUnitsMicros(e.nowUs, &lim.lim, n)
	if err != nil {
		e.err = cmp.Or(e.err, fmt.Errorf("sim: bucket decision at %v: %w", e.now, err))
		return 0
	}
	m.calls += batchCalls(n, a, e.capacity)
	if a > 0 {
		m.admitted += a
		m.win.add(int(j), t, a)
	}
	return a
}

// limitsAt memoises in lim the bucket limits at share, clamped to 1+ε
// (float rounding in the allocator), and reports whether they are usable:
// false for a share of 0 or below (nothing is admitted), or when the bucket
// rejected them (recorded in e.err).
func (e *engine) limitsAt(lim *shareLimits, share float64) bool {
	if share > 0 && share == lim.share {
		return true // memoised (lim.share is at most 1+ε)
	}
	return e.setLimits(lim, share)
}

// ovrSlots is the size of a region's cache of limits at the shares of
// its overrides (engine.ovrLim): subjects with their own share decide
// alternately, and each would otherwise convert its limits again.
const ovrSlots = 1 << ovrSlotBits

const ovrSlotBits = 6

// ovrSlot is share's place in a cache of ovrSlots limits: the top bits of
// a multiplicative hash of its bits.
func ovrSlot(share float64) uint64 {
	return math.Float64bits(share) * 0x9e3779b97f4a7c15 >> (64 - ovrSlotBits)
}

// setLimits is limitsAt's slow path, apart so that the fast one inlines.
func (e *engine) setLimits(lim *shareLimits, share float64) bool {
	if share <= 0 {
		return false
	}
	share = min(share, e.maxShare)
	if share == lim.share {
		return true
	}
	e.converted++
	return e.convert(lim, share, 0)
}

// fillLimits are the limits a region uses for a bucket it creates at
// share, withholding what is above low (bucket.Prepared.TokenLimitsWithheld).
type fillLimits struct {
	shareLimits
	low float64
}

// fillLimits returns region r's limits for a token bucket it creates at
// share (above 0) while the lowest share it held for the subject over the
// last refill time was low < share: the bucket starts with low·C, as a
// regional node starts it (bucket.Request.Withheld).
func (e *engine) fillLimits(r int, share, low float64) *shareLimits {
	f := &e.fillLim[r]
	share = min(share, e.maxShare)
	if f.share != share || f.low != low {
		f.low = low
		f.share = 0
		e.convert(&f.shareLimits, share, share-max(0, min(low, share)))
	}
	return &f.shareLimits
}

// convert sets lim to the limits at share (in (0, 1+ε]) that withhold
// withheld of it from a bucket they create, and reports whether the
// bucket accepted them (else the error is in e.err).
func (e *engine) convert(lim *shareLimits, share, withheld float64) bool {
	l, err := e.prep.TokenLimitsWithheld(share, withheld)
	if err != nil {
		e.err = cmp.Or(e.err, fmt.Errorf("sim: bucket decision at %v: %w", e.now, err))
		return false
	}
	fc := share * float64(e.capacity)
	lim.share, lim.lim, lim.half, lim.whole = share, l, int64(math.Ceil(fc/2)), int64(fc)
	if fr := fc - math.Floor(fc); fr < 0.001 || fr > 0.999 {
		lim.whole = -1 // the bucket's rounding to 0.001 tokens may decide
	}
	return true
}

// floorGens is how many falls of a region's default share a token floor
// outlives (subjectRegion.floor).
const floorGens = 64

// pressured returns how many of n unit requests just decided together in
// sr's bucket in region r at share (a of them admitted, with the limits
// in lim) a regional node reports as pressured (internal/regional): every
// denied one, and every admitted one after which the bucket held less
// than half its capacity f·C. The last of the a admitted left R tokens,
// the one before R+1, and so on. R is read as the whole tokens left: 0
// after a denial, else what one more batch at this instant would admit
// (taken on a copy), or nothing when sr.floor already shows that at least
// half is left, or ⌊f·C⌋ − n when the bucket was full before the batch
// (full: left alone for fullAfter). A request that left R+k tokens just
// under f·C/2, by less than R's fraction, counts as not pressured: at most
// one request of a batch is counted differently from the node.
func (e *engine) pressured(sr *subjectRegion, r int, lim *shareLimits, share float64, full bool, n, a int64) int64 {
	if share <= 0 || e.err != nil {
		return n
	}
	gen := e.shareGen[r]
	var left int64
	switch {
	case a < n || e.cfg.probeAlways:
	case full && lim.whole >= 0:
		left = lim.whole - n
		sr.floor, sr.floorGen = int32(min(left, math.MaxInt32)), gen
		return max(0, min(a, lim.half-left))
	default:
		if g := sr.floorGen; g != 0 && gen-g < floorGens {
			f := int64(sr.floor)
			if m := e.fallMin[r][g%floorGens]; m <= e.maxShare {
				// Clamped to a lower capacity since: at most ⌊m·C⌋,
				// less one for the bucket's rounding of m·C.
				f = min(f, int64(m*float64(e.capacity))-1)
			}
			if f-n >= lim.half {
				sr.floor, sr.floorGen = int32(f-n), gen
				return 0
			}
		}
	}
	if a == n {
		probe := sr.st
		left, _ = probe.TakeUnitsMicros(e.nowUs, &lim.lim, math.MaxInt64)
	}
	sr.floor, sr.floorGen = int32(min(left, math.MaxInt32)), gen
	return n - a + max(0, min(a, lim.half-left)) // admitted ones that left fewer than half
}

// batchCalls is the number of decisions n unit requests arriving together,
// a of them admitted, ask of a Store that takes them in chunks of at most
// capacity (the largest valid cost): one per chunk until one is denied,
// and then one more for the whole tokens left, if any (a mod capacity).
func batchCalls(n, a, capacity int64) int64 {
	if a == n && n <= capacity {
		return 1
	}
	if a == n {
		return (n + capacity - 1) / capacity
	}
	if a%capacity == 0 {
		return a/capacity + 1
	}
	return a/capacity + 2
}
