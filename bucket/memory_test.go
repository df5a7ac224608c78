package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/redistest"
)

func subjectKeys(tb testing.TB, prefix string, n int) []bucket.Key {
	tb.Helper()
	keys := make([]bucket.Key, n)
	for i := range keys {
		k, err := bucket.NewKey("p", 1, fmt.Sprintf("%s%d", prefix, i))
		if err != nil {
			tb.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

func TestMemorySweep(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lim := bucket.Limits{Capacity: 1, RefillPerSecond: 1, IdleTTL: time.Second}
	keys := subjectKeys(t, "s", 100_000)
	for _, k := range keys {
		if _, err := m.TakeAt(t0, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if m.Len() != len(keys) {
		t.Fatalf("Len = %d, want %d", m.Len(), len(keys))
	}
	if n := m.Sweep(t0.Add(999 * time.Millisecond)); n != 0 {
		t.Fatalf("Sweep before the TTL dropped %d", n)
	}
	if n := m.Sweep(t0.Add(time.Second)); n != len(keys) || m.Len() != 0 {
		t.Fatalf("Sweep after the TTL dropped %d, Len %d; want %d and 0", n, m.Len(), len(keys))
	}
}

func TestMemoryCap(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: 3})
	if err != nil {
		t.Fatal(err)
	}
	lim := bucket.Limits{Capacity: 5, RefillPerSecond: 5, IdleTTL: time.Second}
	keys := subjectKeys(t, "c", 4)
	for _, k := range keys[:3] {
		if _, err := m.TakeAt(t0, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	req := bucket.Request{Key: keys[3], Limits: lim, Share: 1, Cost: 1}
	if _, err := m.TakeAt(t0, req); !errors.Is(err, bucket.ErrMemoryFull) {
		t.Fatalf("take at the cap: %v, want ErrMemoryFull", err)
	}
	if d, err := m.TakeAt(t0, bucket.Request{Key: keys[3], Limits: lim, Share: 1}); err != nil || !d.Allowed {
		t.Fatalf("a peek needs no bucket: %+v, %v", d, err)
	}
	if d, err := m.TakeAt(t0, bucket.Request{Key: keys[0], Limits: lim, Share: 1, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("existing buckets keep working: %+v, %v", d, err)
	}
	// Once the others expire, the cap sweeps as much as it needs (the new
	// bucket's shard first, other shards only when that freed nothing:
	// which buckets share a shard depends on the process's hash seed) and
	// admits the new bucket; a full sweep then leaves only the new one.
	if d, err := m.TakeAt(t0.Add(time.Second), req); err != nil || !d.Allowed || m.Len() > 3 {
		t.Fatalf("take after expiry: %+v, %v, Len %d", d, err, m.Len())
	}
	m.Sweep(t0.Add(time.Second))
	if m.Len() != 1 {
		t.Fatalf("after the sweep Len = %d, want 1", m.Len())
	}
}

func TestMemoryTakeAll(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tenant, _ := bucket.NewKey("tenant", 1, "acme")
	endpoint, _ := bucket.NewKey("export", 1, "acme")
	reqs := []bucket.Request{
		{Key: tenant, Limits: bucket.Limits{Capacity: 10, IdleTTL: time.Hour}, Share: 1, Cost: 3},
		{Key: endpoint, Limits: bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 4, Window: time.Minute, IdleTTL: time.Hour}, Share: 1, Cost: 3},
	}
	ds, err := m.TakeAllAt(t0, reqs)
	if err != nil || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("first TakeAll: %+v, %v", ds, err)
	}
	ds, err = m.TakeAllAt(t0, reqs)
	if err != nil || ds[0].Allowed || ds[1].Allowed || ds[0].Remaining != 7 || ds[1].RetryAfter == 0 {
		t.Fatalf("second TakeAll must charge nothing: %+v, %v", ds, err)
	}
	if _, err := m.TakeAllAt(t0, []bucket.Request{reqs[0], reqs[0]}); !errors.Is(err, bucket.ErrDuplicateKey) {
		t.Fatalf("duplicate key: %v", err)
	}
	if _, err := m.TakeAllAt(t0, nil); !errors.Is(err, bucket.ErrTakeAllSize) {
		t.Fatalf("empty TakeAll: %v", err)
	}
}

func TestMemoryHotPathAllocs(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := bucket.NewKey("p", 1, "hot")
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 100, RefillPerSecond: 1e6, IdleTTL: time.Minute}, Share: 0.5, Cost: 1}
	now := t0
	if a := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Microsecond)
		if _, err := m.TakeAt(now, req); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("TakeAt allocates %v times per call", a)
	}
}

func TestMemoryRunSweeps(t *testing.T) {
	clk := clock.NewManual(t0)
	m, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clk, SweepEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := bucket.NewKey("p", 1, "run")
	if _, err := m.Take(context.Background(), bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1, IdleTTL: time.Second}, Share: 1, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = m.Run(ctx)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for m.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	if m.Len() != 0 {
		t.Fatalf("Run did not sweep: Len %d", m.Len())
	}
}

// TestRedisKeysExpire touches 100,000 subjects once and waits for DBSIZE to
// return to where it was (a private server: others' keys do not count).
func TestRedisKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := newRedis(t, c)
	ctx := context.Background()
	before, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	lim := bucket.Limits{Capacity: 1, RefillPerSecond: 1, IdleTTL: time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 64 {
				k, _ := bucket.NewKey("ttl", 1, fmt.Sprintf("s%d", i))
				d, err := r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
				if err != nil || !d.Allowed || d.Remaining != 0 {
					errs <- fmt.Errorf("take %d: %+v, %v (want a charge, which writes the key)", i, d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	peak, _ := c.DBSize(ctx).Result()
	if peak == before {
		t.Fatalf("DBSIZE did not grow right after %d writes", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		size, err := c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if size == before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("DBSIZE %d, want %d: keys left behind", size, before)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	r := newRedis(t, cl.Client(t))
	ctx := context.Background()
	var reqs []bucket.Request
	for _, pol := range []string{"tenant", "export", "login"} {
		k, _ := bucket.NewKey(pol, 1, "acme")
		reqs = append(reqs, bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 5, RefillPerSecond: 1, IdleTTL: time.Minute}, Share: 1, Cost: 2})
	}
	for i, want := range []bool{true, true, false} {
		ds, err := r.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatalf("TakeAll %d on the cluster: %v", i, err)
		}
		for _, d := range ds {
			if d.Allowed != want {
				t.Fatalf("TakeAll %d: %+v, want allowed=%v", i, ds, want)
			}
		}
	}
	// one subject, three algorithms (a group hash and two string keys):
	// one slot, one call, through a client from DialRedis
	dc, err := bucket.DialRedis(strings.Join(cl.Addrs, ","), bucket.DialOptions{ReadTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dc.Close() })
	dr := newRedis(t, dc)
	mixed := []bucket.Limits{
		{Capacity: 5, RefillPerSecond: 1, IdleTTL: time.Minute},
		{Algorithm: bucket.FixedWindow, Capacity: 5, Window: time.Minute, IdleTTL: time.Minute},
		{Algorithm: bucket.SlidingLog, Capacity: 5, Window: time.Minute, IdleTTL: time.Minute},
	}
	var mreqs []bucket.Request
	slots := map[int64]bool{}
	cc := cl.Client(t)
	for i, lim := range mixed {
		k, _ := bucket.NewKey(fmt.Sprintf("mixed%d", i), 1, "acme")
		mreqs = append(mreqs, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 2})
		key, _ := dr.Location(k, lim)
		slot, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	if len(slots) != 1 {
		t.Fatalf("one subject's buckets span slots %v", slots)
	}
	for i, want := range []bool{true, true, false} {
		ds, err := dr.TakeAll(ctx, mreqs)
		if err != nil {
			t.Fatalf("mixed TakeAll %d on the cluster: %v", i, err)
		}
		for _, d := range ds {
			if d.Allowed != want {
				t.Fatalf("mixed TakeAll %d: %+v, want allowed=%v", i, ds, want)
			}
		}
	}
	// subjects in different slots: one call per subject, compensated
	var cross []bucket.Request
	for _, subj := range []string{"acme", "globex", "initech"} {
		k, _ := bucket.NewKey("cross", 1, subj)
		cross = append(cross, bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 5, IdleTTL: time.Minute}, Share: 1, Cost: 3})
	}
	if _, err := r.TakeAll(ctx, cross); err != nil {
		t.Fatalf("cross-slot TakeAll: %v", err)
	}
	if _, err := r.TakeAll(ctx, cross); err != nil {
		t.Fatalf("cross-slot TakeAll: %v", err)
	}
	clusterLossGuard(t, cl)
}
