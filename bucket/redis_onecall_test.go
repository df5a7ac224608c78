package bucket_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// TestRedisTakeAllOneCallOnOneServer: on a single server, a TakeAll over
// buckets of subjects in different groups is one script call, all or
// nothing, whatever the groups.
func TestRedisTakeAllOneCallOnOneServer(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := newRedis(t, c)
	ctx := context.Background()
	lim := bucket.Limits{Capacity: 10, IdleTTL: time.Minute}
	var reqs []bucket.Request
	groups := map[string]bool{}
	for i := range 6 {
		k, err := bucket.NewKey(fmt.Sprintf("p%d", i%2), 1, fmt.Sprintf("subject-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		key, _ := r.Location(k, lim)
		groups[key] = true
		reqs = append(reqs, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 4})
	}
	if len(groups) < 2 {
		t.Fatalf("the subjects share one group key %v: the test needs several", groups)
	}
	tests := []struct {
		name    string
		allowed bool
		remain  float64
	}{
		{"first", true, 6},
		{"second", true, 2},
		{"third denies all", false, 2},
	}
	for _, tt := range tests {
		before := redistest.ScriptCalls(t, c)
		ds, err := r.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if n := redistest.ScriptCalls(t, c) - before; n != 1 {
			t.Fatalf("%s: %d script calls for %d buckets in %d groups, want 1", tt.name, n, len(reqs), len(groups))
		}
		for i, d := range ds {
			if d.Allowed != tt.allowed || d.Remaining != tt.remain {
				t.Fatalf("%s: bucket %d: %+v, want allowed %v, remaining %v", tt.name, i, d, tt.allowed, tt.remain)
			}
		}
	}
	// One bucket short: nothing is charged anywhere.
	k, _ := bucket.NewKey("p0", 1, "subject-other")
	mixed := append([]bucket.Request{{Key: k, Limits: lim, Share: 1, Cost: 1}}, reqs[0])
	ds, err := r.TakeAll(ctx, mixed)
	if err != nil || ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("TakeAll with one short bucket: %+v, %v", ds, err)
	}
	if d, err := r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: 1}); err != nil || d.Remaining != 10 {
		t.Fatalf("peek of the bucket that could admit: %+v, %v; want 10 left (uncharged)", d, err)
	}
}

// behindProxy starts a Redis Cluster and returns a store on a plain
// client of its first node (as behind a proxy that refuses keys of several
// slots), with requests of cost for two subjects of policy whose keys
// under lim lie in different hash slots, both served by that node (a key
// it does not serve answers MOVED).
func behindProxy(t *testing.T, policy string, lim bucket.Limits, cost int64) (*bucket.Redis, []bucket.Request) {
	t.Helper()
	cl := redistest.StartCluster(t)
	node := redis.NewClient(&redis.Options{Addr: cl.Addrs[0]})
	t.Cleanup(func() { _ = node.Close() })
	r := newRedis(t, node)
	ctx := context.Background()
	var reqs []bucket.Request
	slots := map[int64]bool{}
	for i := 0; i < 2000 && len(reqs) < 2; i++ {
		k, _ := bucket.NewKey(policy, 1, fmt.Sprintf("s%d", i))
		key, _ := r.Location(k, lim)
		slot, err := node.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if slots[slot] || node.Exists(ctx, key).Err() != nil {
			continue // the slot of the first, or another node's (MOVED)
		}
		slots[slot] = true
		reqs = append(reqs, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: cost})
	}
	if len(reqs) != 2 {
		t.Fatalf("found %d subjects in distinct slots of node %s", len(reqs), cl.Addrs[0])
	}
	return r, reqs
}

// TestRedisTakeAllCrossSlotFallback: a plain client on one node of a Redis
// Cluster (as behind a proxy that refuses keys of several slots) gets
// CROSSSLOT for the one-call TakeAll; the store then sends one call per
// group, and keeps doing so.
func TestRedisTakeAllCrossSlotFallback(t *testing.T) {
	r, reqs := behindProxy(t, "x", bucket.Limits{Capacity: 10, IdleTTL: time.Minute}, 3)
	ctx := context.Background()
	for i, want := range []float64{7, 4, 1} {
		ds, err := r.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatalf("TakeAll %d: %v", i, err)
		}
		for _, d := range ds {
			if !d.Allowed || d.Remaining != want {
				t.Fatalf("TakeAll %d: %+v, want allowed with %v left", i, ds, want)
			}
		}
	}
}
