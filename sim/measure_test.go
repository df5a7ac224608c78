package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

func TestMeasure(t *testing.T) {
	s := time.Second
	wins := []time.Duration{s, 10 * s}
	for _, c := range []struct {
		name string
		adm  []Admission
		want []float64
	}{
		{"within budget", []Admission{{0, 1, 10}}, []float64{0, 0}},
		{"burst of 2C+2r", []Admission{{0, 1, 22}}, []float64{1, 0.1}},
		{"closed window holds both ends", []Admission{{0, 1, 11}, {s, 1, 11}}, []float64{1, 0.1}},
		{"one nanosecond apart is two windows", []Admission{{0, 1, 11}, {s + 1, 1, 11}}, []float64{0, 0.1}},
		{"unsorted input", []Admission{{s, 1, 11}, {0, 1, 11}}, []float64{1, 0.1}},
		{"budgets are per subject", []Admission{{0, 1, 11}, {0, 2, 11}, {s, 2, 11}}, []float64{1, 0.1}},
		{"zero counts ignored", []Admission{{0, 1, 0}, {s, 1, 0}}, []float64{0, 0}},
		{"nothing admitted", nil, []float64{0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Measure(c.adm, 10, 1, wins)
			if err != nil {
				t.Fatal(err)
			}
			for k := range c.want {
				if math.Abs(m.Overshoot[k]-c.want[k]) > 1e-12 {
					t.Errorf("overshoot(%v) = %v, want %v", wins[k], m.Overshoot[k], c.want[k])
				}
			}
			var total int64
			for _, a := range c.adm {
				total += a.Count
			}
			if m.Admitted != total {
				t.Errorf("admitted %d, want %d", m.Admitted, total)
			}
		})
	}
}

func TestMeasureManyWindows(t *testing.T) {
	var adm []Admission
	for i := 0; i < 400; i++ {
		adm = append(adm, Admission{At: time.Duration(i*i%997) * 37 * time.Millisecond, Subject: i % 3, Count: int64(1 + i%4)})
	}
	var wins []time.Duration
	for k := 1; k <= 9; k++ {
		wins = append(wins, time.Duration(k)*700*time.Millisecond)
	}
	all, err := Measure(adm, 5, 2, wins)
	if err != nil {
		t.Fatal(err)
	}
	for k, w := range wins {
		one, err := Measure(adm, 5, 2, []time.Duration{w})
		if err != nil {
			t.Fatal(err)
		}
		if one.Overshoot[0] != all.Overshoot[k] {
			t.Errorf("window %v: alone %v, among 9 %v", w, one.Overshoot[0], all.Overshoot[k])
		}
	}
}

func TestMeasureErrors(t *testing.T) {
	ok := []time.Duration{time.Second}
	for _, c := range []struct {
		name   string
		adm    []Admission
		c, r   float64
		window []time.Duration
	}{
		{"capacity 0", nil, 0, 1, ok},
		{"capacity NaN", nil, math.NaN(), 1, ok},
		{"negative refill", nil, 1, -1, ok},
		{"no window", nil, 1, 1, nil},
		{"zero window", nil, 1, 1, []time.Duration{0}},
		{"too many windows", nil, 1, 1, make([]time.Duration, MaxMeasureWindows+1)},
		{"negative count", []Admission{{0, 1, -1}}, 1, 1, ok},
	} {
		if _, err := Measure(c.adm, c.c, c.r, c.window); !errors.Is(err, ErrMeasure) {
			t.Errorf("%s: %v, want ErrMeasure", c.name, err)
		}
	}
}

func TestUnderAdmission(t *testing.T) {
	for _, c := range []struct {
		a, ideal int64
		want     float64
	}{{50, 100, 0.5}, {100, 100, 0}, {120, 100, 0}, {0, 100, 1}, {5, 0, 0}} {
		if got := UnderAdmission(c.a, c.ideal); got != c.want {
			t.Errorf("UnderAdmission(%d, %d) = %v, want %v", c.a, c.ideal, got, c.want)
		}
	}
}

// TestExportsMatchRun replays a run's request stream through the exported
// pieces: the stream's total is what the run offered, the ideal bucket
// admits what the run's ideal baseline admitted, and Measure on
// independent per-region ideal buckets finds the run's independent
// baseline overshoot, to the last digit.
func TestExportsMatchRun(t *testing.T) {
	for _, name := range []string{"hot-tenant", "failover"} {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Scenario: sc, Subjects: 300, Duration: 4 * time.Minute, Seed: 9}
		res, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ideal, err := NewIdealBucket(sc.Capacity, sc.RefillPerSecond)
		if err != nil {
			t.Fatal(err)
		}
		var perRegion [MaxScenarioRegions]*IdealBucket
		var independent []Admission
		var offered int64
		last := time.Duration(-1)
		err = Arrivals(cfg, func(a Arrival) bool {
			if a.At < last || a.Count <= 0 || a.Region < 0 || a.Region >= sc.Regions || a.Subject < 0 || a.Subject >= 300 {
				t.Fatalf("bad arrival %+v after %v", a, last)
			}
			last = a.At
			offered += a.Count
			if _, err := ideal.Take(a.At, a.Subject, a.Count); err != nil {
				t.Fatal(err)
			}
			b := perRegion[a.Region]
			if b == nil {
				b, _ = NewIdealBucket(sc.Capacity, sc.RefillPerSecond)
				perRegion[a.Region] = b
			}
			n, err := b.Take(a.At, a.Subject, a.Count)
			if err != nil {
				t.Fatal(err)
			}
			independent = append(independent, Admission{At: a.At, Subject: a.Subject, Count: n})
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if offered != res.Offered || ideal.Admitted() != res.IdealAdmitted {
			t.Errorf("%s: stream offers %d, ideal admits %d; run offered %d, ideal admitted %d", name, offered, ideal.Admitted(), res.Offered, res.IdealAdmitted)
		}
		got, err := IdealAdmitted(cfg)
		if err != nil || got != res.IdealAdmitted {
			t.Errorf("%s: IdealAdmitted = %d, %v; run %d", name, got, err, res.IdealAdmitted)
		}
		m, err := Measure(independent, float64(sc.Capacity), sc.RefillPerSecond, []time.Duration{time.Second, 10 * time.Second, time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		b := res.Baselines[BaselineIndependent]
		if want := []float64{b.Overshoot1s, b.Overshoot10s, b.Overshoot60s}; round(m.Overshoot[0]) != want[0] || round(m.Overshoot[1]) != want[1] || round(m.Overshoot[2]) != want[2] {
			t.Errorf("%s: Measure %v, run's independent baseline %v", name, m.Overshoot, want)
		}
		if m.Overshoot[2] == 0 {
			t.Errorf("%s: independent buckets never overshot; the comparison proves little", name)
		}
	}
}

func TestArrivalsStop(t *testing.T) {
	sc, _ := LoadScenario("steady")
	n := 0
	if err := Arrivals(Config{Scenario: sc, Duration: time.Minute}, func(Arrival) bool { n++; return n < 5 }); err != nil || n != 5 {
		t.Errorf("stopped after %d arrivals, err %v; want 5", n, err)
	}
	if err := Arrivals(Config{}, func(Arrival) bool { return true }); err == nil {
		t.Error("Arrivals accepted a config without a scenario")
	}
}

func TestIdealBucketErrors(t *testing.T) {
	if _, err := NewIdealBucket(0, 1); err == nil {
		t.Error("capacity 0 accepted")
	}
	if _, err := NewIdealBucket(10, 0); err == nil {
		t.Error("refill 0 accepted")
	}
	b, _ := NewIdealBucket(10, 1)
	if _, err := b.Take(time.Second, 1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Take(0, 1, 1); err == nil {
		t.Error("time going back accepted")
	}
	if _, err := b.Take(time.Second, 1, -1); err == nil {
		t.Error("negative count accepted")
	}
}

// TestSweepEqualsRun checks that sharing baseline passes and running in
// parallel change nothing: every Sweep result encodes exactly as Run's.
func TestSweepEqualsRun(t *testing.T) {
	var cfgs []Config
	for _, name := range []string{"steady", "retry-storm", "flash-crowd"} {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, iv := range []time.Duration{time.Second, 15 * time.Second} {
			for _, p := range []Protocol{TwoStep, Naive} {
				cfgs = append(cfgs, Config{Scenario: sc, Subjects: 150, Duration: 3 * time.Minute, Seed: 4, RebalanceInterval: iv, Protocol: p})
			}
		}
	}
	cfgs = append(cfgs, Config{Scenario: cfgs[0].Scenario, Subjects: 150, Duration: 3 * time.Minute, Seed: 4, NoBaselines: true})
	calls := 0
	got, err := Sweep(context.Background(), cfgs, func(done, total int) {
		calls++
		if done != calls || total != len(cfgs) {
			t.Errorf("progress(%d, %d) at call %d", done, total, calls)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != len(cfgs) {
		t.Errorf("progress called %d times for %d runs", calls, len(cfgs))
	}
	for i, c := range cfgs {
		want, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(got[i])
		b, _ := json.Marshal(want)
		if string(a) != string(b) {
			t.Errorf("run %d (%s %v %s): Sweep and Run differ:\n%s\n%s", i, c.Scenario.Name, c.RebalanceInterval, c.Protocol, a, b)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Sweep(ctx, cfgs, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled sweep: %v", err)
	}
}

func ExampleMeasure() {
	// C = 10, r = 1/s. One subject gets 11 admitted at 0 s and 11 more at
	// 1 s: 22 within one closed second, where a global bucket allows 11.
	adm := []Admission{{At: 0, Subject: 7, Count: 11}, {At: time.Second, Subject: 7, Count: 11}}
	m, err := Measure(adm, 10, 1, []time.Duration{time.Second, 10 * time.Second})
	if err != nil {
		panic(err)
	}
	for k, w := range m.Windows {
		fmt.Printf("overshoot(%v) = %.2f\n", w, m.Overshoot[k])
	}
	fmt.Println("under-admission:", UnderAdmission(15, 20))
	// Output:
	// overshoot(1s) = 1.00
	// overshoot(10s) = 0.10
	// under-admission: 0.25
}
