package demo

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quotacoord/quota/bucket"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Process-wide pools and loggers of etcd, gRPC and OpenTelemetry
		// that outlive any one server by design.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
		goleak.IgnoreAnyFunction("gopkg.in/natefinch/lumberjack%2ev2.(*Logger).millRun"),
	)
}

func TestMeasure(t *testing.T) {
	adm := func(at time.Duration) Event { return Event{At: at, Cost: 1, Admitted: true} }
	den := func(at time.Duration) Event { return Event{At: at, Cost: 1} }
	burst := func(n int, at time.Duration, admitted bool) []Event {
		var ev []Event
		for i := 0; i < n; i++ {
			if admitted {
				ev = append(ev, adm(at))
			} else {
				ev = append(ev, den(at))
			}
		}
		return ev
	}
	cases := []struct {
		name      string
		events    []Event
		c         int64
		r         float64
		over1s    float64
		under     float64
		ideal     int64
		admitted  int64
		tolerance float64
	}{
		{"nothing", nil, 10, 1, 0, 0, 0, 0, 0},
		{"a full burst is no overshoot", burst(10, 0, true), 10, 1, 0, 0, 10, 10, 1e-12},
		// 22 at once against C + r·1s = 11: overshoot 1.
		// More than the ideal bucket: under-admission is floored at 0.
		{"twice the burst", burst(22, 0, true), 10, 1, 1, 0, 10, 22, 1e-12},
		// The ideal bucket admits 10 of 20; the regions admitted 5.
		{"half of ideal", append(burst(5, 0, true), burst(15, 0, false)...), 10, 1, 0, 0.5, 10, 5, 1e-12},
		// Two subjects each with a full burst: per-subject budgets, no
		// overshoot, both ideal.
		{"per subject", append(burst(10, 0, true), func() []Event {
			ev := burst(10, 0, true)
			for i := range ev {
				ev[i].Subject = 1
			}
			return ev
		}()...), 10, 1, 0, 0, 20, 20, 1e-12},
		// Refill: 10 at 0 and 10 at 10s are both ideal.
		{"refill", append(burst(10, 0, true), burst(10, 10*time.Second, true)...), 10, 1, 0, 0, 20, 20, 1e-12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Measure(tc.events, tc.c, tc.r, OvershootWindows)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(f.Overshoot[time.Second]-tc.over1s) > tc.tolerance {
				t.Errorf("overshoot(1s) = %v, want %v", f.Overshoot[time.Second], tc.over1s)
			}
			if math.Abs(f.UnderAdmission-tc.under) > tc.tolerance {
				t.Errorf("under-admission = %v, want %v", f.UnderAdmission, tc.under)
			}
			if f.Ideal != tc.ideal || f.Admitted != tc.admitted {
				t.Errorf("ideal %d admitted %d, want %d %d", f.Ideal, f.Admitted, tc.ideal, tc.admitted)
			}
		})
	}
}

// TestMeasureWindowIsClosed: admissions exactly W apart fall in one window.
func TestMeasureWindowIsClosed(t *testing.T) {
	ev := []Event{{At: 0, Cost: 6, Admitted: true}, {At: time.Second, Cost: 6, Admitted: true}}
	f, err := Measure(ev, 5, 1, []time.Duration{time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// 12 in [0, 1s] against 5 + 1 = 6.
	if got := f.Overshoot[time.Second]; math.Abs(got-1) > 1e-12 {
		t.Errorf("overshoot(1s) = %v, want 1", got)
	}
}

func TestStoryValidate(t *testing.T) {
	good := PartnerStory(9*time.Second, 100)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if good.Length() != 9*time.Second {
		t.Errorf("length %v", good.Length())
	}
	bad := []func(s *Story){
		func(s *Story) { s.Regions = nil },
		func(s *Story) { s.Phases = nil },
		func(s *Story) { s.Phases[0].Rates = s.Phases[0].Rates[:1] },
		func(s *Story) { s.Phases[1].Rates[0] = math.NaN() },
		func(s *Story) { s.Phases[1].Rates[0] = -1 },
		func(s *Story) { s.Phases[1].Rates[0] = MaxRate + 1 },
		func(s *Story) { s.Phases[2].For = 0 },
		func(s *Story) { s.Capacity = 0 },
		func(s *Story) { s.RefillPerSecond = math.Inf(1) },
		func(s *Story) { s.Subject = "" },
		func(s *Story) { s.Phases[0].For = MaxLength },
	}
	for i, mutate := range bad {
		s := PartnerStory(9*time.Second, 100)
		mutate(&s)
		if err := s.Validate(); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
	if i, p := good.At(4 * time.Second); i != 1 || !strings.HasPrefix(p.Name, "campaign") {
		t.Errorf("At(4s) = %d %q", i, p.Name)
	}
	if i, _ := good.At(time.Hour); i != 2 {
		t.Errorf("At(after end) = %d", i)
	}
}

// memoryChecker decides with a real in-memory bucket per region at a fixed
// share, standing in for regional nodes in the driver test.
type memoryChecker struct {
	store  *bucket.Memory
	shares []float64
	limits bucket.Limits
}

func (m *memoryChecker) Check(ctx context.Context, region int, policy, subject string, cost int64) (bool, float64, error) {
	key, err := bucket.NewKey(policy+"-r"+string(rune('0'+region)), 1, subject)
	if err != nil {
		return false, 0, err
	}
	d, err := m.store.Take(ctx, bucket.Request{Key: key, Limits: m.limits, Share: m.shares[region], Cost: cost})
	return d.Allowed, m.shares[region], err
}

func TestDriverPlaysStory(t *testing.T) {
	st := Story{
		Regions: []string{"a", "b"},
		Phases: []Phase{
			{Name: "one", For: 600 * time.Millisecond, Rates: []float64{100, 0}},
			{Name: "two", For: 600 * time.Millisecond, Rates: []float64{0, 100}},
		},
		Policy: "p", Subject: "s", Capacity: 10, RefillPerSecond: 10,
	}
	store, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	chk := &memoryChecker{store: store, shares: []float64{0.5, 0.5},
		limits: bucket.Limits{Capacity: 10, RefillPerSecond: 10, IdleTTL: time.Minute}}
	rec := NewRecorder(2, st.Length())
	var phases []int
	d := &Driver{Story: st, Checker: chk, Recorder: rec, OnPhase: func(i int, _ Phase) { phases = append(phases, i) }}
	if err := d.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(phases) != 2 || phases[0] != 0 || phases[1] != 1 {
		t.Errorf("phases %v", phases)
	}
	ev, dropped := rec.Events()
	if dropped != 0 {
		t.Errorf("dropped %d", dropped)
	}
	var off [2]int64
	var adm [2]int64
	for _, e := range ev {
		off[e.Region] += e.Cost
		if e.Admitted {
			adm[e.Region] += e.Cost
		}
	}
	// About 60 arrivals per region (100/s for 0.6 s), each region's bucket
	// holding 5 and refilling 5/s: 5 + 3 admitted.
	for r := 0; r < 2; r++ {
		if off[r] < 45 || off[r] > 70 {
			t.Errorf("region %d offered %d, want about 60", r, off[r])
		}
		if adm[r] < 5 || adm[r] > 10 {
			t.Errorf("region %d admitted %d, want 5 to 10", r, adm[r])
		}
	}
	f, err := Measure(ev, st.Capacity, st.RefillPerSecond, OvershootWindows)
	if err != nil {
		t.Fatal(err)
	}
	if f.Overshoot[10*time.Second] != 0 {
		t.Errorf("half shares overshoot: %v", f.Overshoot)
	}
}

func TestDriverStopsOnCancel(t *testing.T) {
	st := PartnerStory(time.Hour, 10)
	store, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	chk := &memoryChecker{store: store, shares: []float64{0.3, 0.3, 0.3},
		limits: bucket.Limits{Capacity: 10, RefillPerSecond: 10, IdleTTL: time.Minute}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	d := &Driver{Story: st, Checker: chk, Recorder: NewRecorder(3, time.Second)}
	if err := d.Run(ctx); err == nil {
		t.Fatal("Run returned nil after cancel")
	}
}

func TestBar(t *testing.T) {
	cases := []struct {
		x, full float64
		want    string
	}{
		{0, 100, ""},
		{50, 100, "#####"},
		{100, 100, "##########"},
		{120, 100, "##########|!!"},
		{1e9, 100, "##########|" + strings.Repeat("!", 10)},
		{5, 0, ""},
	}
	for _, c := range cases {
		if got := bar(c.x, c.full, 10); got != c.want {
			t.Errorf("bar(%v, %v) = %q, want %q", c.x, c.full, got, c.want)
		}
	}
}

func TestViewPlain(t *testing.T) {
	st := PartnerStory(9*time.Second, 100)
	var out bytes.Buffer
	v := &View{Out: &out, Story: &st}
	v.Show(4*time.Second, Window{Offered: []float64{200, 20, 20}, Admitted: []float64{60, 20, 20}, Share: []float64{0.6, 0.2, 0.2}})
	got := out.String()
	for _, want := range []string{"campaign", "us-east share 0.60", "global adm  100/s of budget 100/s"} {
		if !strings.Contains(got, want) {
			t.Errorf("view line %q lacks %q", got, want)
		}
	}
}

func TestViewTerminalNote(t *testing.T) {
	st := PartnerStory(9*time.Second, 100)
	var out bytes.Buffer
	v := &View{Out: &out, Terminal: true, Story: &st}
	w := Window{Offered: []float64{200, 20, 20}, Admitted: []float64{60, 20, 20}, Share: []float64{0.6, 0.2, 0.2}}
	v.Show(time.Second, w)
	v.SetNote("us-east fails")
	v.Show(2*time.Second, w)
	got := out.String()
	// The second redraw moves up over the first table (7 lines), then
	// draws 8 (the note included).
	if !strings.Contains(got, "\x1b[7A\x1b[J") || !strings.HasSuffix(got, "us-east fails\n") || v.lines != 8 {
		t.Errorf("terminal view with a note:\n%q (lines %d)", got, v.lines)
	}
}
