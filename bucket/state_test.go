package bucket_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// stateDriver keeps one State per key, prepared limits per call.
type stateDriver struct{ states map[bucket.Key]*bucket.State }

func (d stateDriver) do(now time.Time, op string, req bucket.Request) (bucket.Decision, error) {
	p, err := bucket.Prepare(req.Limits)
	if err != nil {
		return bucket.Decision{}, err
	}
	s := d.states[req.Key]
	if s == nil {
		s = new(bucket.State)
		d.states[req.Key] = s
	}
	if op == "refund" {
		return s.RefundAt(now, &p, req.Share, req.Cost)
	}
	return s.TakeAt(now, &p, req.Share, req.Cost)
}

func TestStateSteps(t *testing.T) {
	runSteps(t, stateDriver{map[bucket.Key]*bucket.State{}}, "state")
}

// TestStateMatchesMemory drives a State and a Memory bucket through the same
// random takes, peeks, refunds, share changes, clock jumps (back and past
// the idle TTL) and demands equal decisions.
func TestStateMatchesMemory(t *testing.T) {
	for ai, lim := range []bucket.Limits{
		{Capacity: 7, RefillPerSecond: 2.5, IdleTTL: 30 * time.Second},
		{Capacity: 5, IdleTTL: 30 * time.Second},
		{Capacity: 1000, RefillPerSecond: 333.3, IdleTTL: 30 * time.Second, Overcommit: 0.2},
		{Algorithm: bucket.FixedWindow, Capacity: 9, Window: 700 * time.Millisecond, IdleTTL: 30 * time.Second},
		{Algorithm: bucket.SlidingWindow, Capacity: 9, Window: 700 * time.Millisecond, IdleTTL: 30 * time.Second},
		{Algorithm: bucket.SlidingLog, Capacity: 6, Window: 900 * time.Millisecond, IdleTTL: 30 * time.Second, Overcommit: 0.5},
	} {
		t.Run(fmt.Sprintf("%d-%s", ai, lim.Algorithm), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ai), 7))
			m, err := bucket.NewMemory(bucket.MemoryConfig{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := bucket.Prepare(lim)
			if err != nil {
				t.Fatal(err)
			}
			k, _ := bucket.NewKey("p", 1, "s")
			var s bucket.State
			now, share := t0.UnixMicro(), 1.0
			for step := 0; step < 3000; step++ {
				switch x := rng.IntN(100); {
				case x < 30:
					now += rng.Int64N(2000)
				case x < 40:
					now += rng.Int64N(2_000_000)
				case x < 43:
					now -= rng.Int64N(500_000)
				case x < 45:
					now += 31_000_000
				}
				if rng.IntN(10) == 0 {
					share = 0.05 + rng.Float64()*(0.95+lim.Overcommit)
				}
				at := time.UnixMicro(now)
				cost := rng.Int64N(lim.Capacity/2 + 2)
				var want, got bucket.Decision
				var werr, gerr error
				if rng.IntN(5) == 0 {
					want, werr = m.RefundAt(at, bucket.Request{Key: k, Limits: lim, Share: share, Cost: cost})
					got, gerr = s.RefundAt(at, &p, share, cost)
				} else {
					want, werr = m.TakeAt(at, bucket.Request{Key: k, Limits: lim, Share: share, Cost: cost})
					got, gerr = s.TakeAt(at, &p, share, cost)
				}
				if werr != nil || gerr != nil || want != got {
					t.Fatalf("step %d at %d, share %v, cost %d:\nmemory %+v %v\nstate  %+v %v", step, now, share, cost, want, werr, got, gerr)
				}
			}
		})
	}
}

func TestStateErrors(t *testing.T) {
	lim := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute, Overcommit: 0.1}
	p, err := bucket.Prepare(lim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Prepare(bucket.Limits{Capacity: -1}); !errors.Is(err, bucket.ErrInvalidLimits) {
		t.Errorf("Prepare of bad limits: %v", err)
	}
	if got := p.Limits(); got != lim {
		t.Errorf("Limits() = %+v", got)
	}
	var zero bucket.Prepared
	for _, c := range []struct {
		name  string
		p     *bucket.Prepared
		share float64
		cost  int64
	}{
		{"zero prepared", &zero, 1, 1},
		{"share 0", &p, 0, 1},
		{"share above 1+ε", &p, 1.2, 1},
		{"share NaN", &p, nan(), 1},
		{"negative cost", &p, 1, -1},
		{"cost above capacity", &p, 1, 11},
	} {
		var s bucket.State
		if _, err := s.TakeAt(t0, &p, 1, 4); err != nil {
			t.Fatal(err)
		}
		if _, err := s.TakeAt(t0, c.p, c.share, c.cost); !errors.Is(err, bucket.ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", c.name, err)
		}
		if _, err := s.RefundAt(t0, c.p, c.share, c.cost); !errors.Is(err, bucket.ErrInvalidRequest) {
			t.Errorf("%s: refund %v, want ErrInvalidRequest", c.name, err)
		}
		if d, err := s.TakeAt(t0, &p, 1, 0); err != nil || d.Remaining != 6 {
			t.Errorf("%s: an error changed the state: %+v, %v", c.name, d, err)
		}
	}
}

func nan() float64 { var z float64; return z / z }

func TestStateAllocs(t *testing.T) {
	p, _ := bucket.Prepare(bucket.Limits{Capacity: 100, RefillPerSecond: 1e6, IdleTTL: time.Minute})
	var s bucket.State
	now := t0
	if a := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Microsecond)
		if _, err := s.TakeAt(now, &p, 0.5, 1); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("State.TakeAt allocates %v times per call", a)
	}
}

func BenchmarkStateTake(b *testing.B) {
	p, _ := bucket.Prepare(benchLimits)
	states := make([]bucket.State, 10_000)
	now := t0
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Nanosecond)
		if _, err := states[i].TakeAt(now, &p, 0.5, 1); err != nil {
			b.Fatal(err)
		}
		if i++; i == len(states) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
