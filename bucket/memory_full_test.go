package bucket_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// TestMemoryTakeAllFullChargesNothing: a TakeAll that needs more new
// buckets than the cap leaves room for fails with ErrMemoryFull and changes
// nothing: the existing bucket earlier in the request keeps its tokens, and
// the count of buckets is what it was.
func TestMemoryTakeAllFullChargesNothing(t *testing.T) {
	lim := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}
	for _, tc := range []struct {
		name     string
		max      int
		newKeys  int // new buckets the TakeAll names after the existing one
		wantFull bool
		wantLen  int
	}{
		{name: "two new, room for one", max: 2, newKeys: 2, wantFull: true, wantLen: 1},
		{name: "one new, no room", max: 1, newKeys: 1, wantFull: true, wantLen: 1},
		{name: "three new, room for two", max: 3, newKeys: 3, wantFull: true, wantLen: 1},
		{name: "two new, room for two", max: 3, newKeys: 2, wantLen: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: tc.max})
			if err != nil {
				t.Fatal(err)
			}
			keys := subjectKeys(t, "full", 1+tc.newKeys)
			if d, err := m.TakeAt(t0, bucket.Request{Key: keys[0], Limits: lim, Share: 1, Cost: 1}); err != nil || d.Remaining != 9 {
				t.Fatalf("first take: %+v, %v", d, err)
			}
			reqs := []bucket.Request{{Key: keys[0], Limits: lim, Share: 1, Cost: 5}}
			for _, k := range keys[1:] {
				reqs = append(reqs, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
			}
			ds, err := m.TakeAllAt(t0, reqs)
			if got := errors.Is(err, bucket.ErrMemoryFull); got != tc.wantFull {
				t.Fatalf("TakeAll: %+v, %v; want ErrMemoryFull %v", ds, err, tc.wantFull)
			}
			if m.Len() != tc.wantLen {
				t.Errorf("Len %d after TakeAll, want %d", m.Len(), tc.wantLen)
			}
			want := 4.0 // charged
			if tc.wantFull {
				want = 9 // untouched
			}
			if d, err := m.TakeAt(t0, bucket.Request{Key: keys[0], Limits: lim, Share: 1}); err != nil || d.Remaining != want {
				t.Errorf("existing bucket after TakeAll: %+v, %v; want %v remaining", d, err, want)
			}
			for _, k := range keys[1:] {
				d, err := m.TakeAt(t0, bucket.Request{Key: k, Limits: lim, Share: 1})
				if wantRem := map[bool]float64{true: 10, false: 9}[tc.wantFull]; err != nil || d.Remaining != wantRem {
					t.Errorf("new bucket %s after TakeAll: %+v, %v; want %v remaining", k, d, err, wantRem)
				}
			}
		})
	}
}

// TestMemoryTakeAllReusesExpired: buckets that expired count as new when
// TakeAll reserves room, and the room given back when they turn out to
// still exist keeps the count exact.
func TestMemoryTakeAllReusesExpired(t *testing.T) {
	lim := bucket.Limits{Capacity: 10, RefillPerSecond: 10, IdleTTL: time.Second}
	m, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: 2})
	if err != nil {
		t.Fatal(err)
	}
	keys := subjectKeys(t, "exp", 3)
	for _, k := range keys[:2] {
		if _, err := m.TakeAt(t0, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	later := t0.Add(2 * time.Second) // both expired, neither swept
	ds, err := m.TakeAllAt(later, []bucket.Request{
		{Key: keys[0], Limits: lim, Share: 1, Cost: 2},
		{Key: keys[2], Limits: lim, Share: 1, Cost: 3},
	})
	if err != nil || !ds[0].Allowed || !ds[1].Allowed || ds[0].Remaining != 8 || ds[1].Remaining != 7 {
		t.Fatalf("TakeAll over expired buckets: %+v, %v", ds, err)
	}
	if m.Len() != 2 {
		t.Fatalf("Len %d, want 2", m.Len())
	}
	// Below the cap an expired entry is rewritten in place.
	m2, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.TakeAt(t0, bucket.Request{Key: keys[0], Limits: lim, Share: 1, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.TakeAllAt(later, []bucket.Request{{Key: keys[0], Limits: lim, Share: 1, Cost: 2}, {Key: keys[1], Limits: lim, Share: 1, Cost: 2}}); err != nil {
		t.Fatal(err)
	}
	if m2.Len() != 2 {
		t.Fatalf("Len %d after rewriting an expired bucket, want 2", m2.Len())
	}
}
