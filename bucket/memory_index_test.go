package bucket_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// TestMemoryIndexModel drives Memory with keys whose hashes are forced to
// collide (whole 64-bit hashes shared by distinct keys, and homes packed
// round the end of a shard's index so probes wrap) and compares every
// decision with one State per key, the reference. Sweeps delete entries
// in the middle of probe runs; for token buckets Len is checked against the
// writes made.
func TestMemoryIndexModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		lim  bucket.Limits
		keys int
		seed uint64
	}{
		{"token bucket, few keys", bucket.Limits{Capacity: 5, RefillPerSecond: 5, IdleTTL: time.Second}, 12, 1},
		{"token bucket, growth and shrink", bucket.Limits{Capacity: 5, RefillPerSecond: 5, IdleTTL: time.Second}, 300, 2},
		{"token bucket, other seed", bucket.Limits{Capacity: 3, RefillPerSecond: 10, IdleTTL: 2 * time.Second}, 200, 3},
		{"sliding log (deletes on refund)", bucket.Limits{Algorithm: bucket.SlidingLog, Capacity: 4, Window: 500 * time.Millisecond, IdleTTL: time.Second}, 150, 4},
		{"fixed window", bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 4, Window: 300 * time.Millisecond, IdleTTL: time.Second}, 150, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tc.seed, 7))
			prep, err := bucket.Prepare(tc.lim)
			if err != nil {
				t.Fatal(err)
			}
			m, err := bucket.NewMemory(bucket.MemoryConfig{})
			if err != nil {
				t.Fatal(err)
			}
			keys := make([]bucket.Key, tc.keys)
			for i := range keys {
				k, err := bucket.NewKey("idx", 1, fmt.Sprintf("k%d", i))
				if err != nil {
					t.Fatal(err)
				}
				// Shard 0 or 63; within it, 16 hashes near 0 (home at the
				// start), 16 near 2^32-1 (home at the end of any index),
				// so most keys share their whole hash with others.
				h := uint64(rng.IntN(16))
				if rng.IntN(2) == 0 {
					h = 1<<32 - 1 - h
				}
				if rng.IntN(4) == 0 {
					h |= 63 << 58
				}
				keys[i] = bucket.KeyWithHash(k, h)
			}
			model := make([]bucket.State, len(keys))
			lastWrite := make([]time.Time, len(keys)) // token bucket only
			tb := tc.lim.Algorithm == ""
			now := t0
			for step := range 20_000 {
				now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
				if rng.IntN(500) == 0 {
					m.Sweep(now)
					if tb {
						live := 0
						for _, lw := range lastWrite {
							if !lw.IsZero() && now.Sub(lw) < tc.lim.IdleTTL {
								live++
							}
						}
						if m.Len() != live {
							t.Fatalf("step %d: Len %d after sweep, want %d", step, m.Len(), live)
						}
					}
					continue
				}
				i := rng.IntN(len(keys))
				cost := int64(rng.IntN(3))
				req := bucket.Request{Key: keys[i], Limits: tc.lim, Share: 1, Cost: cost}
				var got, want bucket.Decision
				var gotErr, wantErr error
				refund := rng.IntN(4) == 0
				if refund {
					got, gotErr = m.RefundAt(now, req)
					want, wantErr = model[i].RefundAt(now, &prep, 1, cost)
				} else {
					got, gotErr = m.TakeAt(now, req)
					want, wantErr = model[i].TakeAt(now, &prep, 1, cost)
				}
				if gotErr != nil || wantErr != nil || got != want {
					t.Fatalf("step %d, key %d (refund %v, cost %d): memory %+v, %v; state %+v, %v", step, i, refund, cost, got, gotErr, want, wantErr)
				}
				if cost > 0 && (refund || got.Allowed) {
					lastWrite[i] = now
				}
			}
			if n, left := m.Len(), m.Sweep(now.Add(time.Hour)); n != left || m.Len() != 0 {
				t.Fatalf("final sweep dropped %d of %d, Len %d after", left, n, m.Len())
			}
		})
	}
}

// TestMemoryConcurrentSweeps: goroutines take on many keys of a capped
// store while another sweeps it, so index slots are inserted, shifted and
// swept concurrently, and the cap's sweeps reach other shards. The bucket
// count never passes the cap, every error is ErrMemoryFull, and a final
// sweep after every TTL leaves nothing.
func TestMemoryConcurrentSweeps(t *testing.T) {
	const maxBuckets, workers, perWorker = 500, 4, 3000
	lim := bucket.Limits{Capacity: 3, RefillPerSecond: 30, IdleTTL: 100 * time.Millisecond}
	m, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: maxBuckets})
	if err != nil {
		t.Fatal(err)
	}
	keys := subjectKeys(t, "cs", 2000)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, workers+1)
	var full atomic.Int64
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWorker {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				k := keys[rng.IntN(len(keys))]
				_, err := m.TakeAt(now, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
				if errors.Is(err, bucket.ErrMemoryFull) {
					full.Add(1)
				} else if err != nil {
					errs <- err
					return
				}
				if n := m.Len(); n > maxBuckets {
					errs <- fmt.Errorf("Len %d above the cap %d", n, maxBuckets)
					return
				}
			}
		})
	}
	sweeper := make(chan struct{})
	go func() {
		defer close(sweeper)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				m.Sweep(t0.Add(time.Duration(i%perWorker) * time.Millisecond))
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-sweeper
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d takes failed with ErrMemoryFull", full.Load())
	end := t0.Add(perWorker*time.Millisecond + lim.IdleTTL)
	if n, dropped := m.Len(), m.Sweep(end); dropped != n || m.Len() != 0 {
		t.Fatalf("final sweep dropped %d of %d, Len %d after", dropped, n, m.Len())
	}
}
