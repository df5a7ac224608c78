package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// testEngine returns a system-only engine for cfg over a scenario of n
// regions and subjects subjects with C = capacity and r = refill, at time 0.
func testEngine(t *testing.T, n, subjects int, capacity int64, refill float64, cfg Config) *engine {
	t.Helper()
	cfg.Scenario = &Scenario{Name: "unit", Regions: n, Subjects: subjects, Duration: Duration(time.Minute), Tick: Duration(100 * time.Millisecond),
		Capacity: capacity, RefillPerSecond: refill, Groups: []Group{{Name: "g", Count: subjects, Rate: 0.1, Profile: Profile{Kind: ProfileWeights}}}}
	cfg.NoBaselines = true
	c, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(c, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	e.nowUs = time.Unix(0, 0).UnixMicro()
	return e
}

// TestPressureRule holds the regions' reports to the regional node's rule
// (internal/regional): a request is pressured when denied, or when it left
// its bucket below half the local capacity f·C; a report lists only
// pressured subjects, with their pressured requests.
func TestPressureRule(t *testing.T) {
	// One region (share 1), C = 10, r = 10: half the capacity is 5.
	e := testEngine(t, 1, 3, 10, 10, Config{ReportInterval: time.Second})
	steps := []struct {
		subject       int32
		n             int64
		wantAdmitted  int64
		wantPressured int64 // cumulative for subject this interval
	}{
		{0, 4, 4, 0}, // 10 → 6: never below 5
		{0, 1, 1, 0}, // → 5: not below half
		{0, 2, 2, 2}, // → 4, 3: both below
		{0, 5, 3, 7}, // → 2, 1, 0 and 2 denied
		{1, 5, 5, 0}, // another subject: → 5
		{2, 6, 6, 1}, // → 4 on the sixth
	}
	var admitted int64
	for i, s := range steps {
		before := e.sys.admitted
		e.decide(0, 0, s.subject, s.n)
		if e.err != nil {
			t.Fatal(e.err)
		}
		admitted = e.sys.admitted - before
		if admitted != s.wantAdmitted {
			t.Errorf("step %d: admitted %d, want %d", i, admitted, s.wantAdmitted)
		}
		if got := e.sub[0][s.subject].pressured; got != s.wantPressured {
			t.Errorf("step %d: subject %d pressured %d, want %d", i, s.subject, got, s.wantPressured)
		}
	}
	rep := e.collect(0)
	if rep.offered != 23 {
		t.Errorf("offered %v/s, want 23", rep.offered)
	}
	want := []demand{{0, 7}, {2, 1}}
	if len(rep.subjects) != len(want) {
		t.Fatalf("report subjects %v, want %v", rep.subjects, want)
	}
	for i := range want {
		if rep.subjects[i] != want[i] {
			t.Errorf("report subject %d: %v, want %v", i, rep.subjects[i], want[i])
		}
	}
	// The next interval starts from nothing: subject 0's bucket is empty,
	// so its next request is denied and pressured, counted afresh.
	e.decide(0, 0, 0, 1)
	if rep := e.collect(0); len(rep.subjects) != 1 || rep.subjects[0] != (demand{0, 1}) {
		t.Errorf("second interval: %v, want [{0 1}]", rep.subjects)
	}
}

// TestObserveLikeCoordinator holds the coordinator model to rebalance's
// observe: the latest report per region, smoothed once per round, the
// first observation taken as it is, subject demand over the global rate
// decaying without reports and forgotten after OverrideRounds rounds.
func TestObserveLikeCoordinator(t *testing.T) {
	e := testEngine(t, 3, 10, 10, 10, Config{Smoothing: 0.5, MaxOverrides: 2, OverrideRounds: 3})
	arrive := func(r int, interval int64, offered float64, subjects ...demand) {
		if err := e.handle(&event{kind: evReportArrive, region: r, rep: &report{interval: interval, offered: offered, subjects: subjects}}); err != nil {
			t.Fatal(err)
		}
	}
	near := func(what string, got, want []float64) {
		t.Helper()
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-12 {
				t.Errorf("%s = %v, want %v", what, got, want)
				return
			}
		}
	}
	subject := func(j int32) []float64 {
		if sd := e.sSubject[j]; sd != nil {
			return sd.d
		}
		return nil
	}

	// Round 1: r0 reported twice (only the latest counts), r1 once, r2
	// not at all. First observations are taken as they are.
	arrive(0, 1, 90, demand{5, 40})
	arrive(0, 2, 30, demand{5, 20})
	arrive(1, 1, 10)
	arrive(0, 1, 500) // collected before the one held: ignored
	e.observe()
	near("round 1 default demand", e.sOffered, []float64{0.75, 0.25, 0})
	near("round 1 subject 5", subject(5), []float64{2, 0, 0})
	if e.hasDemand[2] {
		t.Error("region 2 got a first observation without a report")
	}

	// Round 2: demand moves to r1, smoothed once with α = 0.5.
	arrive(0, 3, 10)
	arrive(1, 2, 30, demand{5, 10})
	e.observe()
	near("round 2 default demand", e.sOffered, []float64{0.5, 0.5, 0})
	near("round 2 subject 5", subject(5), []float64{1, 0.5, 0})

	// Rounds 3 to 5: no report names subject 5; it decays and is gone
	// after OverrideRounds rounds.
	arrive(1, 3, 30)
	e.observe()
	near("round 3 subject 5", subject(5), []float64{0.5, 0.25, 0})
	e.observe()
	near("round 4 subject 5", subject(5), []float64{0.25, 0.125, 0})
	e.observe()
	if subject(5) != nil {
		t.Errorf("subject 5 kept after %d rounds without reports: %v", e.cfg.OverrideRounds, subject(5))
	}

	// Bounds: at most MaxOverrides subjects per report are read, at most
	// 2·MaxOverrides kept, new ones taken in region order, then report
	// order.
	arrive(0, 4, 10, demand{1, 9}, demand{2, 8}, demand{3, 7})
	arrive(1, 4, 10, demand{4, 9}, demand{6, 8})
	arrive(2, 1, 10, demand{7, 9}, demand{8, 8})
	e.observe()
	for _, j := range []int32{1, 2, 4, 6} {
		if subject(j) == nil {
			t.Errorf("subject %d not tracked", j)
		}
	}
	for _, j := range []int32{3, 7, 8} {
		if subject(j) != nil {
			t.Errorf("subject %d tracked beyond the bounds", j)
		}
	}

	// A region down for longer than its lease loses its report and its
	// demand; the rest is observed without it.
	prev := append([]float64(nil), e.sOffered...)
	e.up[2], e.downAt[2] = false, 0
	e.now = e.cfg.LeaseTTL
	e.observe()
	if e.latest[2] != nil || e.hasDemand[2] {
		t.Errorf("region 2's report or demand outlived its lease")
	}
	near("default demand without region 2", e.sOffered, []float64{prev[0] + 0.5*(0.5-prev[0]), prev[1] + 0.5*(0.5-prev[1]), 0})
}

// TestReturnedRegionFirstReportRunsRound holds the coordinator model to
// rebalance.Loop.lead: a region back after its lease ended brings a full
// round at its first report, once, off the ticker; a region back before
// its lease ended, or with no coordinator, does not.
func TestReturnedRegionFirstReportRunsRound(t *testing.T) {
	early := func(e *engine) int {
		n := 0
		for _, ev := range e.events {
			if ev.kind == evRebalance && ev.once {
				n++
			}
		}
		return n
	}
	scenario := func(e *engine, kind string) {
		t.Helper()
		if err := e.handle(&event{at: e.now, kind: evScenario, sc: Event{Kind: kind, Region: 2}}); err != nil {
			t.Fatal(err)
		}
	}
	arrive := func(e *engine, interval int64) {
		t.Helper()
		if err := e.handle(&event{at: e.now, kind: evReportArrive, region: 2, rep: &report{interval: interval, offered: 10}}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name      string
		downFor   time.Duration
		coordDown bool
		want      int
	}{
		{"back after its lease", 30 * time.Second, false, 1},
		{"back within its lease", time.Second, false, 0},
		{"back with no coordinator", 30 * time.Second, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := testEngine(t, 3, 10, 10, 10, Config{LeaseTTL: 10 * time.Second})
			scenario(e, EventRegionDown)
			e.now += c.downFor
			if c.coordDown {
				if err := e.handle(&event{at: e.now, kind: evScenario, sc: Event{Kind: EventCoordinatorDown}}); err != nil {
					t.Fatal(err)
				}
			}
			scenario(e, EventRegionUp)
			arrive(e, 1)
			arrive(e, 2)
			if got := early(e); got != c.want {
				t.Fatalf("%d early rounds queued, want %d", got, c.want)
			}
			if e.returned[2] {
				t.Error("region 2 still counted as just back")
			}
		})
	}
}

// TestReturnedRegionReportsAfterAWholeInterval: a region that comes back
// sends its first report once it has served a whole report interval; the
// tick that meets it earlier only resets its counters.
func TestReturnedRegionReportsAfterAWholeInterval(t *testing.T) {
	e := testEngine(t, 3, 10, 10, 10, Config{ReportInterval: time.Second})
	arrivals := func() int {
		n := 0
		for _, ev := range e.events {
			if ev.kind == evReportArrive && ev.region == 2 {
				n++
			}
		}
		return n
	}
	for _, kind := range []string{EventRegionDown, EventRegionUp} {
		if err := e.handle(&event{at: e.now, kind: evScenario, sc: Event{Kind: kind, Region: 2}}); err != nil {
			t.Fatal(err)
		}
		e.now += 30 * time.Second
	}
	up := e.now - 30*time.Second
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{up, 0}, {up + 500*time.Millisecond, 0}, {up + time.Second, 1}} {
		if err := e.handle(&event{at: c.at, kind: evReport, region: 2}); err != nil {
			t.Fatal(err)
		}
		if got := arrivals(); got != c.want {
			t.Fatalf("report tick %v after coming back: %d reports sent, want %d", c.at-up, got, c.want)
		}
	}
}

// TestDeferredRoundFollowsGrowth holds the model to rebalance.Loop.lead:
// a full round over a shrink still waiting is owed, and the growth that
// ends the shrink queues a full round at once.
func TestDeferredRoundFollowsGrowth(t *testing.T) {
	e := testEngine(t, 2, 10, 10, 10, Config{})
	e.published = &allocation{epoch: 1, def: []float64{0.5, 0.5}, overrides: map[int32][]float64{}}
	e.shrink = &allocation{epoch: 2, def: []float64{0.5, 0.3}, overrides: map[int32][]float64{}}
	e.pending = &allocation{def: []float64{0.7, 0.3}, overrides: map[int32][]float64{}}
	e.epoch = 2
	e.now = time.Minute
	if err := e.rebalance(); err != nil {
		t.Fatal(err)
	}
	if !e.owed || e.shrink == nil {
		t.Fatalf("a round over an unacknowledged shrink: owed %v, shrink %v", e.owed, e.shrink)
	}
	for r := range 2 {
		if err := e.handle(&event{at: e.now, kind: evAck, region: r, alloc: e.shrink}); err != nil {
			t.Fatal(err)
		}
	}
	if e.shrink != nil || e.owed {
		t.Fatalf("after every acknowledgement: shrink %v, owed %v", e.shrink, e.owed)
	}
	n := 0
	for _, ev := range e.events {
		if ev.kind == evRebalance && ev.once && ev.at == e.now {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d full rounds queued after the growth, want 1", n)
	}
}

// TestChangedAndShrinks holds the two-step decisions to rebalance's: only
// a change beyond 1e-12 is published, and only one that lowers some share
// (the default, or a subject's in either allocation) needs a shrink epoch.
func TestChangedAndShrinks(t *testing.T) {
	al := func(def []float64, ovr map[int32][]float64) *allocation {
		if ovr == nil {
			ovr = map[int32][]float64{}
		}
		return &allocation{def: def, overrides: ovr}
	}
	cases := []struct {
		name            string
		a, b            *allocation
		changed, shrink bool
	}{
		{"same", al([]float64{0.5, 0.5}, nil), al([]float64{0.5, 0.5 + 1e-13}, nil), false, false},
		{"default grows", al([]float64{0.4, 0.4}, nil), al([]float64{0.5, 0.5}, nil), true, false},
		{"default moves", al([]float64{0.5, 0.5}, nil), al([]float64{0.6, 0.4}, nil), true, true},
		{"override above the default", al([]float64{0.4, 0.4}, nil), al([]float64{0.4, 0.4}, map[int32][]float64{3: {0.6, 0.4}}), true, false},
		{"override below the default", al([]float64{0.5, 0.5}, nil), al([]float64{0.5, 0.5}, map[int32][]float64{3: {0.9, 0.1}}), true, true},
		{"override dropped, default higher", al([]float64{0.5, 0.5}, map[int32][]float64{3: {0.2, 0.2}}), al([]float64{0.5, 0.5}, nil), true, false},
		{"override dropped, default lower", al([]float64{0.5, 0.5}, map[int32][]float64{3: {0.9, 0.1}}), al([]float64{0.5, 0.5}, nil), true, true},
	}
	for _, c := range cases {
		if got := changed(c.a, c.b, 2); got != c.changed {
			t.Errorf("%s: changed %v, want %v", c.name, got, c.changed)
		}
		if got := shrinks(c.a, c.b, 2); got != c.shrink {
			t.Errorf("%s: shrinks %v, want %v", c.name, got, c.shrink)
		}
	}
}

// TestPressureShortcutsMatchProbe holds the shortcuts of the pressure rule
// (a token floor, a bucket known full) to reading the tokens left from the
// bucket after every batch: the results must be identical.
func TestPressureShortcutsMatchProbe(t *testing.T) {
	var cfgs []Config
	for _, name := range []string{"heavy-tail", "failover"} {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, iv := range []time.Duration{time.Second, 15 * time.Second} {
			cfgs = append(cfgs, Config{Scenario: sc, Subjects: 200, Duration: 21 * time.Minute, Seed: 3, RebalanceInterval: iv, NoBaselines: true})
		}
	}
	for _, cfg := range cfgs {
		fast, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.probeAlways = true
		slow, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(fast)
		b, _ := json.Marshal(slow)
		if !bytes.Equal(a, b) {
			t.Errorf("%s at %v: results differ with and without the shortcuts", cfg.Scenario.Name, cfg.RebalanceInterval)
		}
		if fast.Epochs < 4 {
			t.Errorf("%s at %v: %d epochs: shares hardly moved", cfg.Scenario.Name, cfg.RebalanceInterval, fast.Epochs)
		}
	}
}
