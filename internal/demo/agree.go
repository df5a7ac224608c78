package demo

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/sim"
)

// Tolerance is how close the live figures must come to the simulator's:
// |live − sim| ≤ max(Relative·|sim|, Floor), per figure.
type Tolerance struct {
	Relative, Floor float64
}

// AgreementTolerance is the stated tolerance of the sim-versus-live test:
// 10% of the simulator's figure, or 0.01 (one percentage point of the
// ideal bucket's admissions, or of C + r·W) when that is larger: the
// live run is one real-time sample whose report and round instants jitter
// by milliseconds, so figures near zero are compared absolutely.
var AgreementTolerance = Tolerance{Relative: 0.10, Floor: 0.01}

// Within says whether live agrees with predicted.
func (t Tolerance) Within(predicted, live float64) bool {
	return math.Abs(live-predicted) <= t.Allowed(predicted)
}

// Allowed is the largest difference t accepts around predicted.
func (t Tolerance) Allowed(predicted float64) float64 {
	return math.Max(t.Relative*math.Abs(predicted), t.Floor)
}

// AgreeConfig is one scenario run both ways.
type AgreeConfig struct {
	// Scenario is the simulator scenario; its regions, capacity, refill and
	// stream are used as they are. Region failures are played by stopping
	// the region's node; a region's return and coordinator failures cannot
	// be played live and are refused.
	Scenario *sim.Scenario
	Seed     uint64
	// RebalanceInterval (default 1s), ReportInterval (default half of
	// it), LeaseTTL (default 3s), SkewMargin (default 500ms) and MinShare
	// (default 0.05) configure both the simulator and the deployment.
	RebalanceInterval, ReportInterval, LeaseTTL, SkewMargin time.Duration
	MinShare                                                float64
	// Allocator configures both; default MaxMinFair, MaxStep 0.3,
	// DeadBand 0.01 (package rebalance's defaults).
	Allocator *allocator.Params
	// Smoothing is the demand smoothing α of both; default 0.5.
	Smoothing float64
	// PropagationDelay is the simulator's mean coordinator↔region delay;
	// default 20ms (an etcd write, a watch and an apply on loopback).
	// With MeasuredPropagation the prediction compared with the live run
	// uses instead half the mean time measured from an allocation's
	// publication to a region's acknowledgement (which leaves out the
	// acknowledgement's own write and the coordinator's watch, so it
	// reads low: 6 to 11 ms here).
	PropagationDelay    time.Duration
	MeasuredPropagation bool
	// Embedded forces the in-process store instead of redis-server.
	Embedded bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// MaxAgreeArrivals bounds the requests of a live replay.
const MaxAgreeArrivals = 200_000

// Agreement is a scenario's figures from the simulator and from the live
// deployment, measured alike.
type Agreement struct {
	Scenario string
	Store    string
	// Predicted are the simulator's figures compared with Live, the
	// deployment's; Prior are the simulator's with the configured
	// propagation delay (the same as Predicted unless
	// AgreeConfig.MeasuredPropagation).
	Predicted, Prior, Live Figures
	// Propagation is half the mean publication-to-acknowledgement time
	// measured live (0 when no acknowledgement was seen).
	Propagation time.Duration
	// PriorPropagation is the configured delay behind Prior.
	PriorPropagation time.Duration
	// Requests is the stream's length; Errors, Shed and Degraded count
	// checks that failed, could not be sent in time, or were decided by a
	// failure mode instead of the store.
	Requests               int64
	Errors, Shed, Degraded int64
	// Lateness is how far behind schedule the replay fell at worst; Late
	// counts the requests sent more than LateThreshold behind.
	Lateness time.Duration
	Late     int64
	// SimPerSecond and LivePerSecond are the admitted requests in each
	// second of the run.
	SimPerSecond, LivePerSecond []float64
	// SimEpochs and LiveEpochs count published allocations.
	SimEpochs, LiveEpochs int
	// ReportPhases is, per region, when in each report interval the
	// region's demand reports were written (median over the run, as an
	// offset after the replay's start modulo ReportInterval). The
	// simulator's regions all report at multiples of ReportInterval.
	ReportPhases []time.Duration
	// LiveShares is the live allocation history: offset, epoch, phase
	// and each region's default share (for explaining differences).
	LiveShares []ShareChange
}

// ShareChange is one published allocation seen during the live run.
type ShareChange struct {
	At        time.Duration
	Epoch     uint64
	Phase     string
	Default   []float64
	Overrides map[string][]float64
}

// Figure names, in the order Compare lists them.
var figureNames = []string{"overshoot(1s)", "overshoot(10s)", "overshoot(60s)", "under-admission"}

func figureValues(f Figures) []float64 {
	return []float64{f.Overshoot[time.Second], f.Overshoot[10*time.Second], f.Overshoot[60*time.Second], f.UnderAdmission}
}

// Compare lists every figure outside tol, as "name: sim X, live Y, allowed ±Z".
func (a *Agreement) Compare(tol Tolerance) []string {
	var out []string
	p, l := figureValues(a.Predicted), figureValues(a.Live)
	for i, name := range figureNames {
		if !tol.Within(p[i], l[i]) {
			out = append(out, fmt.Sprintf("%s: sim %.4f, live %.4f, allowed ±%.4f", name, p[i], l[i], tol.Allowed(p[i])))
		}
	}
	return out
}

// WriteTable prints the figures side by side with the tolerance.
func (a *Agreement) WriteTable(w io.Writer, tol Tolerance) {
	fmt.Fprintf(w, "scenario %s (%s store): %d requests, errors %d, shed %d, degraded %d, late > %v %d (worst %v), epochs sim %d live %d\n",
		a.Scenario, a.Store, a.Requests, a.Errors, a.Shed, a.Degraded, LateThreshold, a.Late, a.Lateness.Round(time.Millisecond), a.SimEpochs, a.LiveEpochs)
	fmt.Fprintf(w, "propagation coordinator→region: simulator %v; measured live (publication to acknowledgement, halved) %v\n",
		a.PriorPropagation, a.Propagation.Round(time.Millisecond))
	if a.Prior.UnderAdmission != a.Predicted.UnderAdmission {
		fmt.Fprintf(w, "the prediction below uses the measured delay; with %v the simulator predicts under-admission %.4f\n", a.PriorPropagation, a.Prior.UnderAdmission)
	}
	fmt.Fprintf(w, "%-16s %10s %10s %10s  %s\n", "figure", "simulator", "live", "allowed", "")
	p, l := figureValues(a.Predicted), figureValues(a.Live)
	for i, name := range figureNames {
		verdict := "agrees"
		if !tol.Within(p[i], l[i]) {
			verdict = "DISAGREES"
		}
		fmt.Fprintf(w, "%-16s %10.4f %10.4f %10s  %s\n", name, p[i], l[i], "±"+strconv.FormatFloat(tol.Allowed(p[i]), 'f', 4, 64), verdict)
	}
	fmt.Fprintf(w, "admitted: sim %d, live %d; an ideal global bucket admits %d of %d offered\n",
		a.Predicted.Admitted, a.Live.Admitted, a.Live.Ideal, a.Live.Offered)
	var ph []string
	for _, p := range a.ReportPhases {
		ph = append(ph, p.Round(time.Millisecond).String())
	}
	fmt.Fprintf(w, "live demand reports written at these offsets within each report interval (the simulator: 0): %s\n", strings.Join(ph, " "))
}

func (c *AgreeConfig) defaults() error {
	if c.Scenario == nil {
		return errors.New("demo: agreement needs a scenario")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RebalanceInterval, time.Second)
	def(&c.ReportInterval, c.RebalanceInterval/2)
	def(&c.LeaseTTL, 3*time.Second)
	def(&c.SkewMargin, 500*time.Millisecond)
	def(&c.PropagationDelay, 20*time.Millisecond)
	if c.MinShare == 0 {
		c.MinShare = 0.05
	}
	if c.Smoothing == 0 {
		c.Smoothing = 0.5
	}
	if c.Allocator == nil {
		c.Allocator = &allocator.Params{Algorithm: allocator.MaxMinFair, MaxStep: 0.3, DeadBand: 0.01}
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	for _, ev := range c.Scenario.Events {
		if ev.Kind != sim.EventRegionDown {
			return fmt.Errorf("demo: scenario %s: event %q cannot be played live (only %q)", c.Scenario.Name, ev.Kind, sim.EventRegionDown)
		}
	}
	return nil
}

func (c *AgreeConfig) simConfig() sim.Config {
	return sim.Config{
		Scenario: c.Scenario, Seed: c.Seed, Allocator: c.Allocator, Protocol: sim.TwoStep,
		RebalanceInterval: c.RebalanceInterval, ReportInterval: c.ReportInterval,
		PropagationDelay: c.PropagationDelay, LeaseTTL: c.LeaseTTL, SkewMargin: c.SkewMargin,
		Smoothing: c.Smoothing, MinShare: c.MinShare,
		SeriesBins: max(1, int(time.Duration(c.Scenario.Duration)/time.Second)),
	}
}

// ScenarioRegions names a scenario's regions for the deployment, in the
// simulator's order (the coordinator orders regions by name).
func ScenarioRegions(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r%02d", i)
	}
	return out
}

// ScenarioPolicy is the policy document a scenario's subjects are limited
// by: capacity C, refill r, token bucket, minimum share min per region.
func ScenarioPolicy(name string, sc *sim.Scenario, min float64) []byte {
	return []byte(fmt.Sprintf(`policies:
  - name: %s
    version: 1
    subject: tenant
    capacity: %d
    refill_per_second: %g
    failure_mode: local
    min_share:
      default: %g
`, name, sc.Capacity, sc.RefillPerSecond, min))
}

// Agree runs cfg.Scenario in the simulator and live (a deployment on
// loopback, the scenario's stream replayed in real time, starting on a
// coordinator round so that rounds fall at the simulator's offsets), and
// measures both admitted streams alike. It stops everything it started.
func Agree(ctx context.Context, cfg AgreeConfig) (*Agreement, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	sc := cfg.Scenario
	scfg := cfg.simConfig()
	res, err := sim.Run(scfg)
	if err != nil {
		return nil, fmt.Errorf("demo: simulate %s: %w", sc.Name, err)
	}
	var arrivals []Arrival
	var tooMany bool
	subjects := map[int]int32{}
	var names []string
	err = sim.Arrivals(scfg, func(a sim.Arrival) bool {
		if int64(len(arrivals))+a.Count > MaxAgreeArrivals {
			tooMany = true
			return false
		}
		j, ok := subjects[a.Subject]
		if !ok {
			j = int32(len(names))
			subjects[a.Subject] = j
			names = append(names, sim.SubjectID(a.Subject))
		}
		for k := int64(0); k < a.Count; k++ {
			arrivals = append(arrivals, Arrival{At: a.At, Region: a.Region, Subject: j, Cost: 1})
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("demo: stream of %s: %w", sc.Name, err)
	}
	if tooMany {
		return nil, fmt.Errorf("demo: scenario %s offers more than %d requests: too many to replay live", sc.Name, MaxAgreeArrivals)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("demo: scenario %s offers nothing", sc.Name)
	}
	prior := simFigures(res)

	const policyName = "sim-live"
	regions := ScenarioRegions(sc.Regions)
	dep, err := Deploy(ctx, DeployConfig{Regions: regions, Policies: ScenarioPolicy(policyName, sc, cfg.MinShare),
		Embedded: cfg.Embedded, RebalanceInterval: cfg.RebalanceInterval, ReportInterval: cfg.ReportInterval,
		LeaseTTL: cfg.LeaseTTL, SkewMargin: cfg.SkewMargin, MaxStep: cfg.Allocator.MaxStep,
		DeadBand: nonZero(cfg.Allocator.DeadBand), Alpha: cfg.Smoothing,
		// Wait for a slow store rather than let a failure mode decide: the
		// simulator models the store, not its outages.
		StoreTimeout: 2 * time.Second,
		Say:          func(format string, a ...any) { fmt.Fprintf(cfg.Log, format+"\n", a...) }})
	if err != nil {
		return nil, err
	}
	defer dep.Close()
	// The simulator starts from an equal split of 1 + ε.
	equal := make([]float64, sc.Regions)
	for i := range equal {
		equal[i] = (1 + cfg.Allocator.Overcommit) / float64(sc.Regions)
	}
	start, err := dep.Settle(ctx, policyName, equal, 0.02, time.Second)
	if err != nil {
		return nil, err
	}

	length := time.Duration(sc.Duration)
	fmt.Fprintf(cfg.Log, "replaying %d requests of %s over %v from %s\n", len(arrivals), sc.Name, length, start.Format("15:04:05.000"))

	hist := &shareHistory{regions: regions, start: start, reports: make([][]time.Duration, len(regions)),
		published: map[uint64]time.Time{}, acks: make([][]ackAt, len(regions))}
	wctx, wcancel := context.WithCancel(ctx)
	var watchWG sync.WaitGroup
	watchWG.Add(3)
	go func() {
		defer watchWG.Done()
		hist.watchAcks(wctx, dep.Coord.Client, policyName)
	}()
	go func() {
		defer watchWG.Done()
		hist.watch(wctx, dep.Coord.Client, policyName)
	}()
	go func() {
		defer watchWG.Done()
		hist.watchReports(wctx, dep.Coord.Client, length)
	}()
	defer func() { wcancel(); watchWG.Wait() }()

	// Region failures: stop the node at the scenario's instant.
	var stopWG sync.WaitGroup
	for _, ev := range sc.Events {
		region := regions[ev.Region]
		at := start.Add(time.Duration(ev.At))
		stopWG.Add(1)
		go func() {
			defer stopWG.Done()
			t := time.NewTimer(time.Until(at))
			defer t.Stop()
			select {
			case <-wctx.Done():
			case <-t.C:
				dep.StopRegion(region)
			}
		}()
	}
	defer stopWG.Wait()

	rec := NewRecorder(sc.Regions, length)
	rp := &Replay{Arrivals: arrivals, Regions: sc.Regions, Subjects: names, Policy: policyName,
		Checker: dep.Checks, Recorder: rec, Start: start, Timeout: 5 * time.Second}
	if err := rp.Run(ctx); err != nil {
		return nil, err
	}
	events, dropped := rec.Events()
	if dropped > 0 {
		return nil, fmt.Errorf("demo: %d events did not fit the recorder", dropped)
	}
	live, err := Measure(events, sc.Capacity, sc.RefillPerSecond, OvershootWindows)
	if err != nil {
		return nil, err
	}
	a := &Agreement{Scenario: sc.Name, Store: dep.Store, Predicted: prior, Prior: prior, Live: live, PriorPropagation: cfg.PropagationDelay,
		Requests: int64(len(arrivals)), Degraded: dep.Checks.Degraded(), Lateness: rp.Lateness(), Late: rp.LateCount(),
		SimEpochs: res.Epochs}
	if res.Series != nil {
		for _, v := range res.Series.Total {
			a.SimPerSecond = append(a.SimPerSecond, v*res.Series.BinSeconds)
		}
	}
	for sec := time.Duration(0); sec < length; sec += time.Second {
		w := rec.Rates(sec, sec+time.Second)
		t := 0.0
		for _, v := range w.Admitted {
			t += v
		}
		a.LivePerSecond = append(a.LivePerSecond, t)
	}
	w := rec.Rates(0, length)
	for i := range w.Errors {
		a.Errors += w.Errors[i]
		a.Shed += w.Shed[i]
	}
	wcancel()
	watchWG.Wait()
	a.LiveShares = hist.changes()
	a.ReportPhases = hist.phases(cfg.ReportInterval)
	a.Propagation = hist.propagation()
	if cfg.MeasuredPropagation && a.Propagation > 0 {
		mcfg := scfg
		mcfg.PropagationDelay = a.Propagation
		mres, err := sim.Run(mcfg)
		if err != nil {
			return nil, fmt.Errorf("demo: simulate %s with the measured propagation: %w", sc.Name, err)
		}
		a.Predicted = simFigures(mres)
		a.SimEpochs = mres.Epochs
		a.SimPerSecond = a.SimPerSecond[:0]
		for _, v := range mres.Series.Total {
			a.SimPerSecond = append(a.SimPerSecond, v*mres.Series.BinSeconds)
		}
	}
	a.LiveEpochs = len(a.LiveShares)
	return a, nil
}

func simFigures(res *sim.Result) Figures {
	return Figures{Overshoot: map[time.Duration]float64{
		time.Second: res.Overshoot1s, 10 * time.Second: res.Overshoot10s, 60 * time.Second: res.Overshoot60s},
		UnderAdmission: res.UnderAdmission, Admitted: res.Admitted, Ideal: res.IdealAdmitted, Offered: res.Offered}
}

// nonZero keeps an explicit zero dead band zero for the rebalance loop,
// whose zero means its default.
func nonZero(v float64) float64 {
	if v == 0 {
		return 1e-12
	}
	return v
}

// shareHistory records the allocations published during a live run.
type shareHistory struct {
	regions []string
	start   time.Time
	mu      sync.Mutex
	list    []ShareChange
	reports [][]time.Duration // per region: report instants after start
	// published maps epochs published during the run to when; acks are
	// each region's acknowledgements in order.
	published map[uint64]time.Time
	acks      [][]ackAt
}

type ackAt struct {
	epoch uint64
	at    time.Time
}

// watchAcks records every acknowledgement of policy.
func (h *shareHistory) watchAcks(ctx context.Context, cli *clientv3.Client, policy string) {
	for wr := range cli.Watch(ctx, etcdlayout.Layout{}.AcksPrefix(), clientv3.WithPrefix()) {
		for _, ev := range wr.Events {
			var ack etcdlayout.Ack
			if ev.Kv == nil || json.Unmarshal(ev.Kv.Value, &ack) != nil {
				continue
			}
			// A node writes only the acknowledgement shards that changed:
			// another policy's shard says nothing of policy.
			epoch, ok := ack.Epochs[policy]
			if !ok {
				continue
			}
			h.mu.Lock()
			for i, r := range h.regions {
				if r == ack.Region && len(h.acks[i]) < maxShareChanges {
					h.acks[i] = append(h.acks[i], ackAt{epoch: epoch, at: ack.At})
				}
			}
			h.mu.Unlock()
		}
	}
}

// propagation is half the mean publication-to-acknowledgement time.
func (h *shareHistory) propagation() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sum time.Duration
	n := 0
	for _, acks := range h.acks {
		var last uint64
		for _, a := range acks {
			for k := last + 1; k <= a.epoch && a.epoch > last; k++ {
				if at, ok := h.published[k]; ok {
					sum += a.at.Sub(at)
					n++
				}
			}
			last = max(last, a.epoch)
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(2*n)
}

// watchReports records when each region's demand reports were written.
func (h *shareHistory) watchReports(ctx context.Context, cli *clientv3.Client, length time.Duration) {
	for wr := range cli.Watch(ctx, etcdlayout.Layout{}.DemandPrefix(), clientv3.WithPrefix()) {
		for _, ev := range wr.Events {
			var rep etcdlayout.DemandReport
			if ev.Kv == nil || json.Unmarshal(ev.Kv.Value, &rep) != nil {
				continue
			}
			at := rep.At.Sub(h.start)
			if at < 0 || at > length {
				continue
			}
			h.mu.Lock()
			for i, r := range h.regions {
				if r == rep.Region && len(h.reports[i]) < maxShareChanges {
					h.reports[i] = append(h.reports[i], at)
				}
			}
			h.mu.Unlock()
		}
	}
}

// phases returns each region's median report phase modulo interval.
func (h *shareHistory) phases(interval time.Duration) []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]time.Duration, len(h.reports))
	for i, ats := range h.reports {
		if len(ats) == 0 {
			out[i] = -1
			continue
		}
		ph := make([]time.Duration, len(ats))
		for k, at := range ats {
			ph[k] = at % interval
		}
		slices.Sort(ph)
		out[i] = ph[len(ph)/2]
	}
	return out
}

// maxShareChanges bounds the history.
const maxShareChanges = 10_000

func (h *shareHistory) watch(ctx context.Context, cli *clientv3.Client, policy string) {
	for wr := range cli.Watch(ctx, etcdlayout.Layout{}.Alloc(policy)) {
		for _, ev := range wr.Events {
			var a etcdlayout.Allocation
			if ev.Kv == nil || json.Unmarshal(ev.Kv.Value, &a) != nil {
				continue
			}
			c := ShareChange{At: time.Since(h.start), Epoch: a.Epoch, Phase: string(a.Phase), Default: make([]float64, len(h.regions))}
			for i, r := range h.regions {
				c.Default[i] = a.Default[r]
			}
			for s, m := range a.Overrides {
				if c.Overrides == nil {
					c.Overrides = map[string][]float64{}
				}
				o := make([]float64, len(h.regions))
				for i, r := range h.regions {
					o[i] = m[r]
				}
				c.Overrides[s] = o
			}
			h.mu.Lock()
			if len(h.list) < maxShareChanges {
				h.list = append(h.list, c)
			}
			if c.At >= 0 && len(h.published) < maxShareChanges {
				h.published[a.Epoch] = a.PublishedAt
			}
			h.mu.Unlock()
		}
	}
}

func (h *shareHistory) changes() []ShareChange {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]ShareChange(nil), h.list...)
}

//go:embed scenarios/hot-tenant-hop.json
var hotTenantHop []byte

// AgreementScenario is the scenario of the sim-versus-live test: 30 s, a
// hot tenant hopping between 3 regions every 10 s over a steady
// background (scenarios/hot-tenant-hop.json).
func AgreementScenario() (*sim.Scenario, error) {
	sc, err := sim.ParseScenario(hotTenantHop)
	if err != nil {
		return nil, fmt.Errorf("demo: embedded scenario: %w", err)
	}
	return sc, nil
}

// Faithful says whether the live run played the scenario as the simulator
// did: at most 0.5% of the requests failed, were shed or were decided by
// a failure mode, and at most 1% were sent more than LateThreshold late.
// A run that is not faithful measures the machine, not the system.
func (a *Agreement) Faithful() error {
	bad := a.Errors + a.Shed + a.Degraded
	switch {
	case a.Requests == 0:
		return errors.New("no requests")
	case float64(bad) > 0.005*float64(a.Requests):
		return fmt.Errorf("%d of %d requests failed (%d), were shed (%d) or degraded (%d)", bad, a.Requests, a.Errors, a.Shed, a.Degraded)
	case float64(a.Late) > 0.01*float64(a.Requests):
		return fmt.Errorf("%d of %d requests were sent more than %v late (worst %v): the machine is too loaded", a.Late, a.Requests, LateThreshold, a.Lateness)
	}
	return nil
}
