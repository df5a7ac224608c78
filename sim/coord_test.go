package sim

import (
	"bytes"
	"cmp"
	"container/heap"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quotacoord/quota/plan"
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

// TestReturnedRegionFirstReportRunsRound holds the coordinator model to
// rebalance.Loop.lead: a region back after its lease ended brings a full
// round at its first report, once, off the ticker; a region back before
// its lease ended, or with no coordinator, does not.
func TestReturnedRegionFirstReportRunsRound(t *testing.T) {
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
			advance(t, e, c.downFor)
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
			if e.leader != nil && e.leader.Returned(regionName(2)) {
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

// TestDeferredRoundFollowsGrowth: a full round over a shrink still
// waiting is owed, and the growth that ends the shrink queues a full round
// at once (plan.Leader.Settle, as rebalance.Loop does).
func TestDeferredRoundFollowsGrowth(t *testing.T) {
	e := testEngine(t, 2, 10, 10, 10, Config{})
	e.current = &plan.Allocation{Policy: e.policy.Name, Epoch: 2, Phase: plan.PhaseShrink,
		Default: map[string]float64{"r00": 0.5, "r01": 0.3}, Safe: map[string]float64{"r00": 0, "r01": 0},
		Target: &plan.Shares{Default: map[string]float64{"r00": 0.7, "r01": 0.3}}}
	for r := range 2 {
		e.regs[r][0].acked = 1
	}
	e.now = time.Minute
	if err := e.round(true); err != nil {
		t.Fatal(err)
	}
	if e.current.Epoch != 2 || early(e) != 0 {
		t.Fatalf("a full round over an unacknowledged shrink published epoch %d or queued %d rounds", e.current.Epoch, early(e))
	}
	shrink := e.allocationOf(e.current)
	for r := range 2 {
		if err := e.handle(&event{at: e.now, kind: evAck, region: r, alloc: shrink, node: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if e.current.Epoch != 3 || e.current.Phase != plan.PhaseStable {
		t.Fatalf("after every acknowledgement: epoch %d %s, want 3 stable", e.current.Epoch, e.current.Phase)
	}
	if n := early(e); n != 1 {
		t.Fatalf("%d full rounds queued after the growth, want 1", n)
	}
}

// early counts the full rounds queued off the ticker.
func early(e *engine) int {
	n := 0
	for _, ev := range e.events {
		if ev.kind == evRebalance && ev.once {
			n++
		}
	}
	return n
}

// advance runs the engine's control-plane events for d from now.
func advance(t *testing.T, e *engine, d time.Duration) {
	t.Helper()
	end := e.now + d
	for len(e.events) > 0 && e.events[0].at <= end {
		ev := heap.Pop(&e.events).(*event)
		e.now = max(e.now, ev.at)
		if err := e.handle(ev); err != nil {
			t.Fatal(err)
		}
	}
	e.now = end
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

// TestReportKeepsTheMostPressured: a report holds the MaxOverrides most
// pressured subjects of the interval, most pressured first and as
// pressured in subject order, whatever order they were pressed in.
func TestReportKeepsTheMostPressured(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, k := range []int{1, 5, 32} {
		e := testEngine(t, 1, 200, 10, 1, Config{MaxOverrides: k})
		for round := 0; round < 20; round++ {
			var want []demand
			for _, j := range rng.Perm(200)[:rng.IntN(120)] {
				p := int64(1 + rng.IntN(6)) // ties
				e.sub[0][j].pressured = p
				e.pressuredJ[0] = append(e.pressuredJ[0], int32(j))
				want = append(want, demand{int32(j), float64(p)})
			}
			slices.SortFunc(want, func(a, b demand) int {
				if a.v != b.v {
					return cmp.Compare(b.v, a.v)
				}
				return cmp.Compare(a.j, b.j)
			})
			want = want[:min(k, len(want))]
			if got := e.collect(0).subjects; !slices.Equal(got, want) {
				t.Fatalf("max %d, round %d: report %v, want %v", k, round, got, want)
			}
		}
	}
}
