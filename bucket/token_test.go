package bucket_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/quotacoord/quota/bucket"
)

// TestTokenStateEqualsUnitTakes drives a TokenState with batches of n unit
// requests and a State with the same n requests one TakeAt of cost 1 at a
// time, through random batch sizes, shares (shrinks clamp, growths refill at the old share until written), clock steps
// (forward, backward, past the idle TTL), and demands the same admitted
// counts and the same stored bucket after every batch.
func TestTokenStateEqualsUnitTakes(t *testing.T) {
	for ai, lim := range []bucket.Limits{
		{Capacity: 7, RefillPerSecond: 2.5, IdleTTL: 30 * time.Second},
		{Capacity: 5, IdleTTL: 30 * time.Second}, // no refill: allowance per TTL
		{Capacity: 1000, RefillPerSecond: 333.3, IdleTTL: 30 * time.Second, Overcommit: 0.2},
		{Capacity: 20, RefillPerSecond: 2, IdleTTL: 70 * time.Second, Overcommit: 0.5},
		{Capacity: 3, RefillPerSecond: 0.7, IdleTTL: 5 * time.Second},
		{Capacity: 50, RefillPerSecond: 1e6, IdleTTL: time.Second},
		{Capacity: 1, RefillPerSecond: 1, IdleTTL: time.Second},
	} {
		t.Run(fmt.Sprintf("%d", ai), func(t *testing.T) {
			p, err := bucket.Prepare(lim)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(ai), 17))
			var ts bucket.TokenState
			var s bucket.State
			now, share := t0.UnixMicro(), 1.0
			for step := 0; step < 4000; step++ {
				switch x := rng.IntN(100); {
				case x < 30:
					now += rng.Int64N(3000)
				case x < 45:
					now += rng.Int64N(3_000_000)
				case x < 48:
					now -= rng.Int64N(2_000_000)
				case x < 50:
					now += lim.IdleTTL.Microseconds() + rng.Int64N(3)
				}
				if rng.IntN(8) == 0 {
					share = 0.01 + rng.Float64()*(0.99+lim.Overcommit)
				}
				n := rng.Int64N(min(2*lim.Capacity+3, 120))
				if rng.IntN(40) == 0 {
					n = lim.Capacity + rng.Int64N(lim.Capacity+3)
				}
				if rng.IntN(4) == 0 {
					n = rng.Int64N(3)
				}
				at := time.UnixMicro(now)
				var got int64
				if step%2 == 0 {
					got, err = ts.TakeUnitsAt(at, &p, share, n)
				} else {
					tl, lerr := p.TokenLimits(share)
					if lerr != nil {
						t.Fatal(lerr)
					}
					got, err = ts.TakeUnitsWith(at, &tl, n)
				}
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				want := int64(0)
				for i := int64(0); i < n; i++ {
					d, err := s.TakeAt(at, &p, share, 1)
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if d.Allowed {
						want++
					}
				}
				if got != want {
					t.Fatalf("step %d (share %v, n %d, now %d): admitted %d, one by one %d", step, share, n, now, got, want)
				}
				if got, want := bucket.TokenStateBucket(&ts), bucket.StateBucket(&s); got != want {
					t.Fatalf("step %d: bucket %+v, one by one %+v", step, got, want)
				}
			}
		})
	}
}

func TestTokenStateErrors(t *testing.T) {
	tb, err := bucket.Prepare(bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := bucket.Prepare(bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 10, Window: time.Second, IdleTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		p     *bucket.Prepared
		share float64
		n     int64
	}{
		{"not prepared", &bucket.Prepared{}, 1, 1},
		{"window algorithm", &fw, 1, 1},
		{"share 0", &tb, 0, 1},
		{"share above 1+ε", &tb, 1.5, 1},
		{"negative n", &tb, 1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s bucket.TokenState
			if _, err := s.TakeUnitsAt(t0, tc.p, tc.share, tc.n); !errors.Is(err, bucket.ErrInvalidRequest) {
				t.Fatalf("err %v, want ErrInvalidRequest", err)
			}
			if s != (bucket.TokenState{}) {
				t.Fatal("an error changed the bucket")
			}
		})
	}
	var s bucket.TokenState
	if _, err := s.TakeUnitsWith(t0, &bucket.TokenLimits{}, 1); !errors.Is(err, bucket.ErrInvalidRequest) {
		t.Fatalf("zero TokenLimits: err %v, want ErrInvalidRequest", err)
	}
	if _, err := tb.TokenLimits(0); !errors.Is(err, bucket.ErrInvalidRequest) {
		t.Fatalf("TokenLimits at share 0: err %v, want ErrInvalidRequest", err)
	}
	if _, err := fw.TokenLimits(1); !errors.Is(err, bucket.ErrInvalidRequest) {
		t.Fatalf("TokenLimits of a fixed window: err %v, want ErrInvalidRequest", err)
	}
}

func TestTokenStateSize(t *testing.T) {
	if n := unsafe.Sizeof(bucket.TokenState{}); n > 32 {
		t.Fatalf("TokenState is %d bytes, want at most 32", n)
	}
}

func ExampleTokenState_TakeUnitsAt() {
	p, err := bucket.Prepare(bucket.Limits{Capacity: 10, RefillPerSecond: 2, IdleTTL: time.Minute})
	if err != nil {
		panic(err)
	}
	var s bucket.TokenState // absent: full
	t := time.Unix(0, 0)
	for _, step := range []struct {
		after time.Duration
		n     int64
	}{{0, 4}, {0, 8}, {time.Second, 3}, {1500 * time.Millisecond, 5}} {
		t = t.Add(step.after)
		admitted, err := s.TakeUnitsAt(t, &p, 0.5, step.n) // share 0.5: 5 tokens, 1 per second
		if err != nil {
			panic(err)
		}
		fmt.Printf("%v: %d of %d\n", t.Sub(time.Unix(0, 0)), admitted, step.n)
	}
	// Output:
	// 0s: 4 of 4
	// 0s: 1 of 8
	// 1s: 1 of 3
	// 2.5s: 1 of 5
}
