package bucket_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// guardedRedis is a Redis store with LossGuard on a private server (its
// loss markers are the server's), deciding at *now (microseconds).
func guardedRedis(t *testing.T, srv *redistest.Server, now *int64) *bucket.Redis {
	t.Helper()
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: srv.Client(t), LossGuard: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if now != nil {
		bucket.SetRedisNow(r, func() int64 { return *now })
	}
	return r
}

// TestRedisLossGuardAfterFlush: a subject spends its bucket, Redis loses
// every key (FLUSHALL), and within the next refill time the subject gets
// no more than what refilled since the loss was detected; without the
// guard its bucket read full. Window algorithms read the window of the
// loss as full.
func TestRedisLossGuardAfterFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	var now int64
	r := guardedRedis(t, srv, &now)
	tb := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * time.Second}
	fw := bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 3, Window: 10 * time.Second, IdleTTL: 10 * time.Second}
	kt, _ := bucket.NewKey("tb", 1, "acme")
	kf, _ := bucket.NewKey("fw", 1, "acme")
	take := func(at time.Duration, k bucket.Key, lim bucket.Limits, cost int64) bucket.Decision {
		t.Helper()
		now = t0.Add(at).UnixMicro()
		d, err := r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// A store in service for an hour: the markers are old, buckets start
	// full.
	take(-time.Hour, kt, tb, 0)
	if d := take(0, kt, tb, 10); !d.Allowed {
		t.Fatalf("a bucket long after the marker: %+v, want it full", d)
	}
	if d := take(100*time.Millisecond, kf, fw, 3); !d.Allowed {
		t.Fatalf("fixed window: %+v, want 3 admitted", d)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Detected at 2s: the bucket reads as emptied then.
	if d := take(2*time.Second, kt, tb, 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("right after the loss: %+v, want nothing (the bucket read full before the guard)", d)
	}
	if d := take(5*time.Second, kt, tb, 4); d.Allowed || d.Remaining != 3 {
		t.Fatalf("3s after the loss: %+v, want 3 tokens, 4 denied", d)
	}
	if d := take(5*time.Second, kt, tb, 3); !d.Allowed {
		t.Fatalf("3s after the loss: %+v, want 3 admitted", d)
	}
	if d := take(2*time.Second, kf, fw, 1); d.Allowed {
		t.Fatalf("fixed window after the loss: %+v, want the loss's window full", d)
	}
	if d := take(10*time.Second, kf, fw, 3); !d.Allowed {
		t.Fatalf("fixed window, next window: %+v, want 3 admitted", d)
	}
	// A refill time after the group detected the loss, a new bucket of
	// the group (another policy of the subject) starts full; a group
	// first used after the loss detects it then.
	kn, _ := bucket.NewKey("tb2", 1, "acme")
	if d := take(13*time.Second, kn, tb, 10); !d.Allowed {
		t.Fatalf("a refill time after the loss: %+v, want a full bucket", d)
	}
	ko, _ := bucket.NewKey("tb", 1, "globex")
	if d := take(13*time.Second, ko, tb, 1); d.Allowed {
		t.Fatalf("another group's first use after the loss: %+v, want it denied", d)
	}
}

// TestRedisLossGuardAfterRestart: the same after a restart without
// persistence, on Redis TIME.
func TestRedisLossGuardAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	r := guardedRedis(t, srv, nil)
	// refill time 200ms
	lim := bucket.Limits{Capacity: 10, RefillPerSecond: 50, IdleTTL: time.Second}
	k, _ := bucket.NewKey("tb", 1, "acme")
	req := bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 10}
	// A new server reads as one that lost its state: wait out a refill.
	if d, err := r.Take(ctx, req); err != nil || d.Allowed {
		t.Fatalf("first take on a new server: %+v, %v; want it denied", d, err)
	}
	time.Sleep(250 * time.Millisecond)
	if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("a refill later: %+v, %v; want 10 admitted", d, err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var admitted int64
	for time.Since(start) < 100*time.Millisecond {
		d, err := r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
		if err != nil {
			continue // the client reconnects
		}
		if d.Allowed {
			admitted++
		}
	}
	// At most what refilled in the 100ms since the restart (5 tokens) and
	// a token of slack for the reconnection; without the guard, 10 more.
	if admitted > 6 {
		t.Fatalf("admitted %d within 100ms of the restart, want at most 6 (refill since the loss)", admitted)
	}
}

// TestMemoryLossGuard: a Memory with LossGuard starts as a store that lost
// its state; without it, buckets start full.
func TestMemoryLossGuard(t *testing.T) {
	lim := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * time.Second}
	k, _ := bucket.NewKey("tb", 1, "acme")
	req := bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 10}
	for _, tc := range []struct {
		guard bool
		want  bool
	}{{false, true}, {true, false}} {
		m, err := bucket.NewMemory(bucket.MemoryConfig{LossGuard: tc.guard})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := m.TakeAt(t0, req); err != nil || d.Allowed != tc.want {
			t.Fatalf("guard %v: %+v, %v; want allowed %v", tc.guard, d, err, tc.want)
		}
		if d, err := m.TakeAt(t0.Add(10*time.Second), req); err != nil || !d.Allowed {
			t.Fatalf("guard %v, a refill later: %+v, %v; want 10 admitted", tc.guard, d, err)
		}
	}
	if _, err := bucket.NewMemory(bucket.MemoryConfig{LossGuard: true, Groups: bucket.MaxGroups + 1}); err == nil {
		t.Fatal("Groups above MaxGroups accepted")
	}
}

// clusterLossGuard (part of TestRedisCluster, which starts the cluster):
// the loss marker shares the bucket's hash tag, so a guarded script reads
// and creates it on a Redis Cluster node.
func clusterLossGuard(t *testing.T, cl *redistest.Cluster) {
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: cl.Client(t), LossGuard: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx := context.Background()
	var reqs []bucket.Request
	for i, lim := range []bucket.Limits{
		{Capacity: 5, RefillPerSecond: 1, IdleTTL: time.Minute},
		{Algorithm: bucket.FixedWindow, Capacity: 5, Window: time.Minute, IdleTTL: time.Minute},
		{Algorithm: bucket.SlidingLog, Capacity: 5, Window: time.Minute, IdleTTL: time.Minute},
	} {
		k, _ := bucket.NewKey("guard"+string(rune('a'+i)), 1, "acme")
		reqs = append(reqs, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
	}
	ds, err := r.TakeAll(ctx, reqs)
	if err != nil {
		t.Fatalf("guarded TakeAll on the cluster: %v", err)
	}
	for _, d := range ds {
		if d.Allowed {
			t.Fatalf("a new cluster's buckets: %+v, want them read as lost", ds)
		}
	}
	key, _ := r.Location(reqs[0].Key, reqs[0].Limits)
	marker := "rl:m:" + key[strings.Index(key, "{"):strings.Index(key, "}")+1]
	if n, err := cl.Client(t).Exists(ctx, marker).Result(); err != nil || n != 1 {
		t.Fatalf("marker %s: exists %d, %v", marker, n, err)
	}
}
