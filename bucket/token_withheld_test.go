package bucket_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// TestTokenStateWithheldEqualsMemory drives a TokenState with limits that
// withhold part of the share (TokenLimitsWithheld) and a Memory with the
// same requests' Share and Withheld, one unit at a time, through random
// shares, withheld parts and clock steps that often let the bucket expire
// (so that takes create it), and demands the same decisions.
func TestTokenStateWithheldEqualsMemory(t *testing.T) {
	for ai, lim := range []bucket.Limits{
		{Capacity: 20, RefillPerSecond: 2, IdleTTL: 11 * time.Second},
		{Capacity: 1000, RefillPerSecond: 333.3, IdleTTL: 4 * time.Second, Overcommit: 0.2},
		{Capacity: 3, RefillPerSecond: 0.7, IdleTTL: 5 * time.Second},
		{Capacity: 5, IdleTTL: 30 * time.Second}, // no refill: allowance per TTL
	} {
		t.Run(fmt.Sprint(ai), func(t *testing.T) {
			p, err := bucket.Prepare(lim)
			if err != nil {
				t.Fatal(err)
			}
			m, err := bucket.NewMemory(bucket.MemoryConfig{})
			if err != nil {
				t.Fatal(err)
			}
			key, err := bucket.NewKey("p", 1, "s")
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(ai), 29))
			var ts bucket.TokenState
			now, share, withheld := t0, 1.0, 0.0
			created := 0
			for step := 0; step < 3000; step++ {
				switch x := rng.IntN(100); {
				case x < 40:
					now = now.Add(time.Duration(rng.Int64N(300_000)) * time.Microsecond)
				case x < 50:
					now = now.Add(lim.IdleTTL + time.Duration(rng.Int64N(3))*time.Microsecond)
				}
				if rng.IntN(6) == 0 {
					share = 0.01 + rng.Float64()*(0.99+lim.Overcommit)
					withheld = []float64{0, share, share * rng.Float64(), share - 0.6000000000000001*share}[rng.IntN(4)]
				}
				tl, err := p.TokenLimitsWithheld(share, withheld)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				// Stored says whether the fill can matter: a stored bucket
				// decides the same whatever is withheld, one the take
				// creates starts empty with the whole share withheld.
				none, all := ts, ts
				tlNone, _ := p.TokenLimitsWithheld(share, 0)
				tlAll, _ := p.TokenLimitsWithheld(share, share)
				a0, _ := none.TakeUnitsWith(now, &tlNone, 1)
				a1, _ := all.TakeUnitsWith(now, &tlAll, 1)
				if stored := ts.Stored(now.UnixMicro(), &tl); stored && a0 != a1 || !stored && a1 != 0 {
					t.Fatalf("step %d: Stored %v, but one unit is admitted %d withholding nothing, %d withholding all", step, stored, a0, a1)
				}
				n := rng.Int64N(min(lim.Capacity+2, 30))
				got, err := ts.TakeUnitsWith(now, &tl, n)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				want := int64(0)
				for i := int64(0); i < n; i++ {
					d, err := m.TakeAt(now, bucket.Request{Key: key, Limits: lim, Share: share, Withheld: withheld, Cost: 1})
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if d.Allowed {
						want++
					}
				}
				if got != want {
					t.Fatalf("step %d (share %v, withheld %v, n %d): admitted %d, Memory %d", step, share, withheld, n, got, want)
				}
				if withheld > 0 && n > 0 && got < min(n, int64(share*float64(lim.Capacity))) {
					created++
				}
			}
			if created == 0 {
				t.Fatal("no take found a bucket short of its capacity: the withheld part was never tried")
			}
		})
	}
}

func TestTokenLimitsWithheldErrors(t *testing.T) {
	tb, err := bucket.Prepare(bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ share, withheld float64 }{{0.5, -0.1}, {0.5, 0.6}, {0, 0}, {1.5, 0}} {
		if _, err := tb.TokenLimitsWithheld(c.share, c.withheld); !errors.Is(err, bucket.ErrInvalidRequest) {
			t.Errorf("TokenLimitsWithheld(%v, %v): err %v, want ErrInvalidRequest", c.share, c.withheld, err)
		}
	}
	// A bucket created with half the share withheld holds half of f·C.
	tl, err := tb.TokenLimitsWithheld(0.8, 0.4)
	if err != nil {
		t.Fatal(err)
	}
	var s bucket.TokenState
	if got, err := s.TakeUnitsWith(t0, &tl, 100); err != nil || got != 4 {
		t.Fatalf("a new bucket at share 0.8 withholding 0.4 admitted %d (%v), want 4", got, err)
	}
}
