package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// chunkedBatch is how the simulator decided a batch before
// bucket.TokenState: n unit requests as a bucket.State take of cost n (in
// chunks of at most capacity) and, on a denial, one of ⌊remaining⌋. It
// returns the admitted count and the decisions it asked for.
func chunkedBatch(st *bucket.State, p *bucket.Prepared, now time.Time, share float64, capacity, n int64) (admitted, calls int64, err error) {
	for left := n; left > 0; {
		c := min(left, capacity)
		calls++
		d, err := st.TakeAt(now, p, share, c)
		if err != nil {
			return admitted, calls, err
		}
		if d.Allowed {
			admitted, left = admitted+c, left-c
			continue
		}
		if k := min(c, int64(math.Floor(d.Remaining+1e-9))); k > 0 {
			calls++
			d2, err := st.TakeAt(now, p, share, k)
			if err != nil {
				return admitted, calls, err
			}
			if d2.Allowed {
				admitted += k
			}
		}
		break
	}
	return admitted, calls, nil
}

// TestTakeUnitsMatchesChunks: the simulator's batches (TokenState.TakeUnitsAt
// and batchCalls) admit and count calls as the chunked State takes did, at
// the simulator's instants (tick multiples from the Unix epoch), with share
// changes and batches above capacity.
func TestTakeUnitsMatchesChunks(t *testing.T) {
	for ci, c := range []struct {
		capacity int64
		refill   float64
		eps      float64
	}{{20, 2, 0}, {100, 1, 0.25}, {7, 0.3, 0.5}, {1000, 333.3, 0}} {
		t.Run(fmt.Sprint(ci), func(t *testing.T) {
			p, err := bucket.Prepare(idealLimits(c.capacity, c.refill, c.eps))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(ci), 5))
			var tok bucket.TokenState
			var st bucket.State
			tick, share := int64(0), 1.0
			for step := 0; step < 3000; step++ {
				tick += rng.Int64N(30)
				if rng.IntN(10) == 0 {
					share = 0.01 + rng.Float64()*(0.99+c.eps)
				}
				n := 1 + rng.Int64N(min(3*c.capacity, 100))
				if rng.IntN(50) == 0 {
					n = c.capacity + rng.Int64N(2*c.capacity)
				}
				now := time.Unix(0, 0).Add(time.Duration(tick) * 100 * time.Millisecond)
				want, wantCalls, err := chunkedBatch(&st, &p, now, share, c.capacity, n)
				if err != nil {
					t.Fatal(err)
				}
				got, err := tok.TakeUnitsAt(now, &p, share, n)
				if err != nil {
					t.Fatal(err)
				}
				if calls := batchCalls(n, got, c.capacity); got != want || calls != wantCalls {
					t.Fatalf("step %d (n %d, share %v): admitted %d in %d calls, chunks %d in %d", step, n, share, got, calls, want, wantCalls)
				}
			}
		})
	}
}
