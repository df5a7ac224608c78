package demand

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type rec struct {
	policy, subject string
	cost            int64
	admitted        bool
	pressured       bool
}

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		name    string
		in      Config
		want    Config
		wantErr bool
	}{
		{name: "zero", in: Config{}, want: Config{TopK: 32, MaxPolicies: 1024, Shards: 8}},
		{name: "kept", in: Config{TopK: 3, MaxPolicies: 2, Shards: 1}, want: Config{TopK: 3, MaxPolicies: 2, Shards: 1}},
		{name: "negative topk", in: Config{TopK: -1}, wantErr: true},
		{name: "huge topk", in: Config{TopK: MaxTopK + 1}, wantErr: true},
		{name: "negative policies", in: Config{MaxPolicies: -5}, wantErr: true},
		{name: "too many shards", in: Config{Shards: MaxShards + 1}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.withDefaults()
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("err = %v, want ErrInvalidConfig", err)
				}
				if _, err := New(tt.in); err == nil {
					t.Fatal("New accepted an invalid config")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Clock == nil {
				t.Fatal("no default clock")
			}
			got.Clock = nil
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSnapshot(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		records  []rec
		interval time.Duration
		want     map[string]etcdlayout.PolicyDemand
		dropped  uint64
	}{
		{
			name:     "offered and admitted rates, denied counts as offered",
			records:  []rec{{"p", "a", 4, true, false}, {"p", "a", 6, false, true}, {"q", "b", 10, true, false}},
			interval: 2 * time.Second,
			want: map[string]etcdlayout.PolicyDemand{
				"p": {Offered: 5, Admitted: 2, Pressured: []etcdlayout.SubjectDemand{{Subject: "a", Offered: 3, Admitted: 0, Denied: true}}},
				"q": {Offered: 5, Admitted: 5},
			},
		},
		{
			name:     "peeks and negative costs ignored",
			records:  []rec{{"p", "a", 0, true, true}, {"p", "a", -3, false, true}},
			interval: time.Second,
			want:     map[string]etcdlayout.PolicyDemand{},
		},
		{
			name: "pressured but admitted is not denied; order by pressured cost then subject",
			records: []rec{
				{"p", "low", 1, true, true}, {"p", "hot", 5, true, true}, {"p", "hot", 5, false, true},
				{"p", "mid", 3, true, true}, {"p", "also-mid", 3, true, true},
			},
			interval: time.Second,
			want: map[string]etcdlayout.PolicyDemand{"p": {Offered: 17, Admitted: 12, Pressured: []etcdlayout.SubjectDemand{
				{Subject: "hot", Offered: 10, Admitted: 5, Denied: true},
				{Subject: "also-mid", Offered: 3, Admitted: 3},
				{Subject: "mid", Offered: 3, Admitted: 3},
				{Subject: "low", Offered: 1, Admitted: 1},
			}}},
		},
		{
			name: "space-saving replaces the smallest counter and inherits its count",
			cfg:  Config{TopK: 2, Shards: 1},
			records: []rec{
				{"p", "a", 5, true, true}, {"p", "b", 3, true, true}, {"p", "c", 1, false, true},
			},
			interval: time.Second,
			want: map[string]etcdlayout.PolicyDemand{"p": {Offered: 9, Admitted: 8, Pressured: []etcdlayout.SubjectDemand{
				{Subject: "a", Offered: 5, Admitted: 5},
				{Subject: "c", Offered: 4, Admitted: 0, Denied: true},
			}}},
		},
		{
			name:     "policy cap drops further policies",
			cfg:      Config{MaxPolicies: 1},
			records:  []rec{{"p", "a", 2, true, false}, {"q", "a", 2, true, false}, {"q", "a", 2, true, false}},
			interval: time.Second,
			want:     map[string]etcdlayout.PolicyDemand{"p": {Offered: 2, Admitted: 2}},
			dropped:  2,
		},
		{
			name:     "bad policy names dropped",
			records:  []rec{{"", "a", 2, true, false}, {strings.Repeat("x", MaxPolicyNameLen+1), "a", 2, true, false}},
			interval: time.Second,
			want:     map[string]etcdlayout.PolicyDemand{},
			dropped:  2,
		},
		{
			name:     "long or empty subjects counted but not kept",
			records:  []rec{{"p", strings.Repeat("s", MaxSubjectLen+1), 2, false, true}, {"p", "", 2, false, true}},
			interval: 4 * time.Second,
			want:     map[string]etcdlayout.PolicyDemand{"p": {Offered: 1, Admitted: 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clock.NewManual(t0)
			tt.cfg.Clock = clk
			r, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range tt.records {
				r.Record(x.policy, x.subject, x.cost, x.admitted, x.pressured)
			}
			got := r.Snapshot(clk.Advance(tt.interval))
			if !equal(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
			if r.Dropped() != tt.dropped {
				t.Fatalf("dropped = %d, want %d", r.Dropped(), tt.dropped)
			}
			if again := r.Snapshot(clk.Advance(time.Second)); len(again) != 0 {
				t.Fatalf("snapshot did not reset: %+v", again)
			}
		})
	}
}

func equal(a, b map[string]etcdlayout.PolicyDemand) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

func TestReportInterval(t *testing.T) {
	clk := clock.NewManual(t0)
	r, err := New(Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	r.Record("p", "a", 30, true, false)
	rep := r.Report("eu", clk.Advance(3*time.Second))
	if rep.Region != "eu" || !rep.At.Equal(t0.Add(3*time.Second)) || rep.IntervalSeconds != 3 || rep.Policies["p"].Offered != 10 {
		t.Fatalf("report = %+v", rep)
	}
	r.Record("p", "a", 10, true, false)
	rep = r.Report("eu", clk.Advance(500*time.Millisecond))
	if rep.IntervalSeconds != 0.5 || rep.Policies["p"].Offered != 20 {
		t.Fatalf("second report = %+v", rep)
	}
}

func TestClockSteppingBackKeepsRecords(t *testing.T) {
	clk := clock.NewManual(t0)
	r, err := New(Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	r.Record("p", "a", 8, true, false)
	if got := r.Snapshot(clk.Advance(-time.Minute)); len(got) != 0 {
		t.Fatalf("backward snapshot = %+v, want empty", got)
	}
	got := r.Snapshot(clk.Advance(2 * time.Second))
	if got["p"].Offered != 4 {
		t.Fatalf("after stepping back got %+v, want offered 4/s", got)
	}
}

func TestFullTableEvictsIdlePolicies(t *testing.T) {
	clk := clock.NewManual(t0)
	r, err := New(Config{Clock: clk, MaxPolicies: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.Record("p", "a", 1, true, false)
	r.Record("q", "a", 1, true, false) // table full, p busy: dropped
	if r.Dropped() != 1 {
		t.Fatalf("dropped = %d, want 1", r.Dropped())
	}
	r.Snapshot(clk.Advance(time.Second))
	r.Snapshot(clk.Advance(time.Second)) // p idle once
	r.Record("q", "a", 1, true, false)   // still not evictable
	if r.Dropped() != 2 {
		t.Fatalf("dropped = %d, want 2", r.Dropped())
	}
	pd := (*r.policies.Load())["p"]
	r.Snapshot(clk.Advance(time.Second)) // p idle twice
	r.Record("q", "a", 5, true, false)   // evicts p
	if r.Dropped() != 2 || len(*r.policies.Load()) != 1 {
		t.Fatalf("dropped = %d, policies %v", r.Dropped(), *r.policies.Load())
	}
	// A record that raced the eviction still reaches the next snapshot.
	pd.offered.Add(3)
	got := r.Snapshot(clk.Advance(time.Second))
	if got["p"].Offered != 3 || got["q"].Offered != 5 {
		t.Fatalf("got %+v", got)
	}
}

// TestConcurrentRecordAndSnapshot checks, under -race, that no cost is lost
// or counted twice while snapshots run beside many recorders.
func TestConcurrentRecordAndSnapshot(t *testing.T) {
	clk := clock.NewManual(t0)
	r, err := New(Config{Clock: clk, TopK: 4, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	const workers, per = 8, 5000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var total, admitted float64
	var snapWG sync.WaitGroup
	snapWG.Add(1)
	go func() {
		defer snapWG.Done()
		for {
			// Each snapshot covers exactly one second, so rates are costs.
			for _, d := range r.Snapshot(clk.Advance(time.Second)) {
				total += d.Offered
				admitted += d.Admitted
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				pol := fmt.Sprintf("p%d", i%3)
				sub := fmt.Sprintf("s%d", (i*7+w)%50)
				r.Record(pol, sub, 2, i%2 == 0, i%5 == 0)
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	snapWG.Wait()
	for _, d := range r.Snapshot(clk.Advance(time.Second)) {
		total += d.Offered
		admitted += d.Admitted
		if len(d.Pressured) > 4 {
			t.Fatalf("pressured list of %d > TopK", len(d.Pressured))
		}
	}
	if want := float64(workers * per * 2); total != want || admitted != want/2 {
		t.Fatalf("offered %v admitted %v, want %v and %v", total, admitted, want, want/2)
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	subjects := make([]string, 100)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("tenant-%d", i)
	}
	r.Record("p", "warm", 1, true, true)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		r.Record("p", subjects[i%len(subjects)], 1, i%3 != 0, i%2 == 0)
		i++
	})
	if allocs != 0 {
		t.Fatalf("Record allocates %v times per call", allocs)
	}
}

func BenchmarkRecord(b *testing.B) {
	for _, bc := range []struct {
		name      string
		pressured bool
	}{{"plain", false}, {"pressured", true}} {
		b.Run(bc.name, func(b *testing.B) {
			r, err := New(Config{})
			if err != nil {
				b.Fatal(err)
			}
			subjects := make([]string, 10000)
			for i := range subjects {
				subjects[i] = fmt.Sprintf("tenant-%d", i)
			}
			r.Record("p", subjects[0], 1, true, false)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					r.Record("p", subjects[i%len(subjects)], 1, true, bc.pressured)
					i++
				}
			})
		})
	}
}

// TestSnapshotTopKAcrossShards: shards are chosen by a hash with a random
// seed (so that nobody can aim subjects at one shard), so which subjects
// collide varies from run to run. What Space-Saving promises does not: at
// most TopK subjects, each reported count at least its true count and at
// most the policy's total.
func TestSnapshotTopKAcrossShards(t *testing.T) {
	truth := map[string]float64{"a": 1, "b": 2, "c": 3, "d": 4}
	for run := 0; run < 50; run++ {
		clk := clock.NewManual(t0)
		r, err := New(Config{Clock: clk, TopK: 2, Shards: 4})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"a", "b", "c", "d"} {
			r.Record("p", s, int64(truth[s]), true, true)
		}
		got := r.Snapshot(clk.Advance(time.Second))["p"]
		if got.Offered != 10 || got.Admitted != 10 {
			t.Fatalf("run %d: offered/admitted = %v/%v, want 10/10", run, got.Offered, got.Admitted)
		}
		if len(got.Pressured) == 0 || len(got.Pressured) > 2 {
			t.Fatalf("run %d: %d pressured subjects, want 1 or 2", run, len(got.Pressured))
		}
		for i, sd := range got.Pressured {
			if sd.Offered < truth[sd.Subject] || sd.Offered > 10 {
				t.Fatalf("run %d: %s offered %v, true %v", run, sd.Subject, sd.Offered, truth[sd.Subject])
			}
			if i > 0 && sd.Offered > got.Pressured[i-1].Offered {
				t.Fatalf("run %d: pressured not sorted: %+v", run, got.Pressured)
			}
		}
	}
}

// TestCountersSaturate is an attack on the counters: costs that sum past
// the int64 range (a caller sending hits_addend near 2^53 again and
// again, or one huge cost) saturate at math.MaxInt64 instead of wrapping
// to a negative demand, in the policy totals, in a subject's pressured
// count and across shards.
func TestCountersSaturate(t *testing.T) {
	clk := clock.NewManual(t0)
	r, err := New(Config{Clock: clk, Shards: 2, TopK: 1})
	if err != nil {
		t.Fatal(err)
	}
	const huge = math.MaxInt64 / 3
	for i := 0; i < 5; i++ {
		r.Record("p", "attacker", huge, i%2 == 0, true)
		r.Record("p", fmt.Sprintf("s%d", i), huge, true, true) // Space-Saving takeovers inherit counts
	}
	got := r.Snapshot(t0.Add(time.Second))["p"]
	max := float64(math.MaxInt64)
	if got.Offered != max || got.Admitted != max {
		t.Fatalf("offered %v admitted %v, want both saturated at %v", got.Offered, got.Admitted, max)
	}
	for _, s := range got.Pressured {
		if s.Offered <= 0 || s.Offered > max || s.Admitted < 0 || s.Admitted > s.Offered {
			t.Fatalf("subject %s: offered %v admitted %v, want saturated in (0, %v]", s.Subject, s.Offered, s.Admitted, max)
		}
	}
	if len(got.Pressured) == 0 {
		t.Fatal("no pressured subjects reported")
	}
}

// TestLearningPoliciesCostsLinear: a node that meets P policies for the
// first time (at start, or when they are defined) allocates about the
// same per policy at 1,000 and at 10,000. Copying the whole table for
// each new policy cost O(P) per policy: at 10,000 policies that was
// several times the per-policy bytes of 1,000, and seconds of CPU per
// node.
func TestLearningPoliciesCostsLinear(t *testing.T) {
	perPolicy := func(n int) float64 {
		r, err := New(Config{Clock: clock.NewManual(t0), MaxPolicies: n})
		if err != nil {
			t.Fatal(err)
		}
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("policy-%d", i)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, p := range names {
			r.Record(p, "s", 1, true, false)
		}
		runtime.ReadMemStats(&after)
		if got := len(r.Snapshot(t0.Add(time.Second))); got != n {
			t.Fatalf("%d policies reported, want %d", got, n)
		}
		return float64(after.TotalAlloc-before.TotalAlloc) / float64(n)
	}
	small, large := perPolicy(1000), perPolicy(10000)
	if large > 1.5*small {
		t.Fatalf("learning a policy allocates %.0f B among 10,000 against %.0f B among 1,000: more than linear", large, small)
	}
}
