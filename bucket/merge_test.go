package bucket_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// concurrently runs n goroutines released together, each calling do(i),
// and fails t on the first error.
func concurrently(t *testing.T, n int, do func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := do(i); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// raceTakes runs 64 goroutines, each taking per times through r, going
// round reqs from its own offset, and returns how many takes each request
// had admitted.
func raceTakes(t *testing.T, r *bucket.Redis, reqs []bucket.Request, per int) []int {
	t.Helper()
	admitted := make([]int, len(reqs))
	var mu sync.Mutex
	concurrently(t, 64, func(g int) error {
		for j := range per {
			b := (g*per + j) % len(reqs)
			d, err := r.Take(context.Background(), reqs[b])
			if err != nil {
				return err
			}
			if d.Allowed {
				mu.Lock()
				admitted[b]++
				mu.Unlock()
			}
		}
		return nil
	})
	return admitted
}

// noRefill are limits of every algorithm that admit exactly 100 of cost 1
// within the test.
var noRefill = []bucket.Limits{
	{Capacity: 100, IdleTTL: time.Minute},
	{Algorithm: bucket.FixedWindow, Capacity: 100, Window: time.Hour, IdleTTL: time.Hour},
	{Algorithm: bucket.SlidingWindow, Capacity: 100, Window: time.Hour, IdleTTL: 2 * time.Hour},
	{Algorithm: bucket.SlidingLog, Capacity: 100, Window: time.Hour, IdleTTL: time.Hour},
}

// TestRedisMergedTakesAreExact: 64 goroutines race over buckets of every
// algorithm, two subjects each; the store merges their single-bucket
// takes into fewer script calls (one bucket may appear many times in one
// call), and every bucket still admits exactly its capacity.
func TestRedisMergedTakesAreExact(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Flushers: 1, Merge: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	var reqs []bucket.Request
	for i, lim := range noRefill {
		for _, subj := range []string{"acme", "globex"} {
			k, _ := bucket.NewKey(fmt.Sprintf("merge%d", i), 1, subj)
			reqs = append(reqs, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
		}
	}
	const perGoroutine = 25 // 1600 takes, 200 per bucket
	before := redistest.ScriptCalls(t, c)
	admitted := raceTakes(t, r, reqs, perGoroutine)
	calls := redistest.ScriptCalls(t, c) - before
	for b, n := range admitted {
		if n != 100 {
			t.Errorf("%s (%s): admitted %d, want exactly 100", reqs[b].Key, reqs[b].Limits.Algorithm, n)
		}
	}
	if takes := 64 * perGoroutine; calls >= takes {
		t.Fatalf("%d takes went out in %d script calls: none merged", takes, calls)
	} else {
		t.Logf("%d takes in %d script calls", takes, calls)
	}
}

// TestRedisMergedParameterSets: merged takes of one policy at several
// costs and shares (several parameter sets in one script call) each
// charge their own cost and report their own capacity.
func TestRedisMergedParameterSets(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Flushers: 1, Merge: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx := context.Background()
	lim := bucket.Limits{Capacity: 100, IdleTTL: time.Minute}
	shares := []float64{1, 0.5}
	keys := make([]bucket.Key, len(shares))
	for b := range keys {
		keys[b], _ = bucket.NewKey("mergesets", 1, fmt.Sprintf("s%d", b))
	}
	var mu sync.Mutex
	spent := make([]int64, len(keys))
	const per = 20
	before := redistest.ScriptCalls(t, c)
	concurrently(t, 64, func(g int) error {
		b, cost := g%2, int64(1+g/2%2)
		req := bucket.Request{Key: keys[b], Limits: lim, Share: shares[b], Cost: cost}
		for range per {
			d, err := r.Take(ctx, req)
			if err != nil {
				return err
			}
			if d.Limit != shares[b]*100 {
				return fmt.Errorf("%s at share %v: limit %v", keys[b], shares[b], d.Limit)
			}
			if d.Allowed {
				mu.Lock()
				spent[b] += cost
				mu.Unlock()
			}
		}
		return nil
	})
	if calls := redistest.ScriptCalls(t, c) - before; calls >= 64*per {
		t.Fatalf("%d takes went out in %d script calls: none merged", 64*per, calls)
	}
	for b, k := range keys {
		d, err := r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: shares[b]})
		if err != nil {
			t.Fatal(err)
		}
		if got := shares[b]*100 - d.Remaining; got != float64(spent[b]) || d.Remaining > 1 {
			t.Errorf("%s: %v units gone, admitted takes cost %d (remaining %v)", k, got, spent[b], d.Remaining)
		}
	}
}

// TestRedisMergedRefunds: concurrent refunds of one bucket, merged, each
// add their cost.
func TestRedisMergedRefunds(t *testing.T) {
	r := newRedis(t, redistest.Client(t))
	ctx := context.Background()
	k, _ := bucket.NewKey("mergerefund", 1, redistest.Unique(t))
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 100, IdleTTL: time.Minute}, Share: 1, Cost: 100}
	if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("emptying take: %+v, %v", d, err)
	}
	req.Cost = 1
	concurrently(t, 64, func(int) error {
		_, err := r.Refund(ctx, req)
		return err
	})
	req.Cost = 0
	if d, err := r.Take(ctx, req); err != nil || d.Remaining != 64 {
		t.Fatalf("peek after 64 refunds of 1: %+v, %v; want 64 remaining", d, err)
	}
}

// TestRedisMergedAfterScriptFlush: merged calls meet NOSCRIPT after SCRIPT
// FLUSH and are resent with EVAL, once each.
func TestRedisMergedAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := newRedis(t, c)
	ctx := context.Background()
	k, _ := bucket.NewKey("mergeflush", 1, "s")
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1000, IdleTTL: time.Minute}, Share: 1, Cost: 1}
	for round := 1; round <= 3; round++ {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		concurrently(t, 64, func(int) error {
			d, err := r.Take(ctx, req)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied with %v left", d.Remaining)
			}
			return err
		})
		peek := req
		peek.Cost = 0
		if d, err := r.Take(ctx, peek); err != nil || d.Remaining != float64(1000-64*round) {
			t.Fatalf("round %d: peek %+v, %v; want %d remaining", round, d, err, 1000-64*round)
		}
	}
}

// checkGroupClusterSlots fails t when the store's slot of a group tag is
// not the one the cluster node c computes.
func checkGroupClusterSlots(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	pipe := c.Pipeline()
	var cmds []*redis.IntCmd
	groups := []uint32{0, 1, 9, 10, 99, 4095, 65535, bucket.MaxGroups - 1}
	for g := uint32(100); g < 1100; g += 7 {
		groups = append(groups, g)
	}
	for _, g := range groups {
		cmds = append(cmds, pipe.ClusterKeySlot(ctx, fmt.Sprintf("rl:v1:{g.%d}:p", g)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, g := range groups {
		if got, want := bucket.GroupClusterSlot(g), cmds[i].Val(); int64(got) != want {
			t.Fatalf("group %d: slot %d, Redis says %d", g, got, want)
		}
	}
}

// TestRedisClusterMergesWithinSlots: on a cluster, concurrent takes merge
// only with takes of their slot (the store computes slots as Redis does);
// every bucket admits exactly its capacity.
func TestRedisClusterMergesWithinSlots(t *testing.T) {
	cl := redistest.StartCluster(t)
	node := redis.NewClient(&redis.Options{Addr: cl.Addrs[0]})
	t.Cleanup(func() { _ = node.Close() })
	checkGroupClusterSlots(t, node)
	r := newRedis(t, cl.Client(t))
	var reqs []bucket.Request
	for i := range 12 {
		k, _ := bucket.NewKey("clustermerge", 1, fmt.Sprintf("s%d", i))
		reqs = append(reqs, bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 20, IdleTTL: time.Minute}, Share: 1, Cost: 1})
	}
	admitted := raceTakes(t, r, reqs, 6) // 384 takes, 32 per bucket
	for b, n := range admitted {
		if n != 20 {
			t.Errorf("%s: admitted %d, want exactly 20", reqs[b].Key, n)
		}
	}
}

// TestRedisMergedCrossSlotFallback: through a plain client on one node of
// a cluster (as behind a proxy), merged takes of subjects in different
// slots meet CROSSSLOT; the store resends them one by one, charging each
// exactly once, and merges within one slot from then on.
func TestRedisMergedCrossSlotFallback(t *testing.T) {
	r, reqs := behindProxy(t, "mergecross", bucket.Limits{Capacity: 100_000, IdleTTL: time.Minute}, 1)
	ctx := context.Background()
	taken := 0
	for round := 0; round < 50 && !bucket.RedisCrossSlot(r); round++ {
		concurrently(t, 64, func(g int) error {
			_, err := r.Take(ctx, reqs[g%2])
			return err
		})
		taken += 32
	}
	if !bucket.RedisCrossSlot(r) {
		t.Fatal("no merged call met CROSSSLOT in 50 rounds of 64 concurrent takes")
	}
	concurrently(t, 64, func(g int) error {
		_, err := r.Take(ctx, reqs[g%2])
		return err
	})
	taken += 32
	for _, req := range reqs {
		req.Cost = 0
		if d, err := r.Take(ctx, req); err != nil || d.Remaining != float64(100_000-taken) {
			t.Fatalf("%s: peek %+v, %v; want %d remaining (each take charged once)", req.Key, d, err, 100_000-taken)
		}
	}
}

// set is one parameter set of the take script (lua/take.lua): a token
// bucket of capacity lim and cost in units, refill 0.1 unit/µs, TTL 60 s,
// full fill, no since.
func set(lim, cost int) []any { return []any{"tb", lim, 0.1, cost, 60000, lim, 0} }

// scriptArgs is a take script call's ARGV: operation, test time, guard,
// the number of sets, the sets, then tail (each bucket's set number and
// field).
func scriptArgs(op, guard string, sets [][]any, tail ...any) []any {
	argv := []any{op, "", guard, len(sets)}
	for _, s := range sets {
		argv = append(argv, s...)
	}
	return append(argv, tail...)
}

// TestScriptRejectsBadArguments: the script answers malformed calls with
// an error and writes nothing.
func TestScriptRejectsBadArguments(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	key := "rl:v1:{g." + redistest.Unique(t) + "}:p"
	src := bucket.TokenBucketScript()
	one := [][]any{set(1000, 1000)}
	two := [][]any{set(1000, 1000), set(2000, 1000)}
	for _, tc := range []struct {
		name string
		keys int
		argv []any
		want string
	}{
		{"missing arguments", 1, []any{"t", "", "0", 1}, "4 arguments, want at least 12 for 1 keys and 1 parameter sets"},
		{"an extra argument", 1, scriptArgs("t", "0", one, 1, "s", "x"), "want 13 arguments for 1 keys and 1 parameter sets, got 14"},
		{"a bucket's field missing", 2, scriptArgs("t", "0", one, 1, "s", 1), "14 arguments end before the field of key 2 of 2"},
		{"a bucket's set number missing", 2, scriptArgs("t", "0", one, 1, "s"), "13 arguments end before key 2 of 2 (1 parameter sets)"},
		{"a bucket's field empty", 1, scriptArgs("t", "0", one, 1, ""), "key 1 has an empty field"},
		{"no parameter set", 1, scriptArgs("t", "0", nil, 1, "s"), "0 parameter sets for 1 keys, want 1 to 1"},
		{"more sets than keys", 1, scriptArgs("t", "0", two, 1, "s"), "2 parameter sets for 1 keys, want 1 to 1"},
		{"set count not a number", 1, []any{"t", "", "0", "x", "tb", 1000, 0.1, 1000, 60000, 1000, 0, 1, "s"}, "x parameter sets"},
		{"no keys", 0, []any{"t", "", "0", 1}, "1 parameter sets for 0 keys"},
		{"set number 0", 1, scriptArgs("t", "0", one, 0, "s"), "key 1 names parameter set 0, want 1 to 1"},
		{"set number past the sets", 2, scriptArgs("i", "0", two, 1, "s", 3, "s2"), "key 2 names parameter set 3, want 1 to 2"},
		{"set number not whole", 2, scriptArgs("i", "0", two, 1, "s", "1.5", "s2"), "key 2 names parameter set 1.5, want 1 to 2"},
		{"set number not a number", 1, scriptArgs("t", "0", one, "x", "s"), "key 1 names parameter set x"},
		{"unknown operation", 1, scriptArgs("x", "0", one, 1, "s"), "unknown operation x"},
		{"unknown algorithm", 1, scriptArgs("i", "0", [][]any{{"zz", 1000, 0.1, 1000, 60000, 1000, 0}}, 1, "s"), "unknown algorithm zz"},
		{"fill above the capacity", 1, scriptArgs("t", "0", [][]any{{"tb", 1000, 0.1, 1000, 60000, 1001, 0}}, 1, "s"), "fill 1001 outside"},
		{"fill not a number", 1, scriptArgs("t", "0", [][]any{{"tb", 1000, 0.1, 1000, 60000, "x", 0}}, 1, "s"), "fill x outside"},
		{"since negative", 1, scriptArgs("t", "0", [][]any{{"tb", 1000, 0.1, 1000, 60000, 1000, -5}}, 1, "s"), "since -5 is not an instant"},
		{"since not a number", 1, scriptArgs("t", "0", [][]any{{"tb", 1000, 0.1, 1000, 60000, 1000, "x"}}, 1, "s"), "since x is not an instant"},
		{"second set's fill above its capacity", 2, scriptArgs("t", "0", [][]any{set(1000, 1000), {"tb", 1000, 0.1, 1000, 60000, 1001, 0}}, 1, "s", 2, "s2"), "fill 1001 outside"},
		{"guard not 0 or 1", 1, scriptArgs("t", "yes", one, 1, "s"), "guard yes, want 0 or 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := make([]string, tc.keys)
			for i := range keys {
				keys[i] = key
			}
			err := c.Eval(ctx, src, keys, tc.argv...).Err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("the refused call wrote %s: %d, %v", key, n, err)
			}
		})
	}
}

// TestScriptParameterSets: in one call of several parameter sets, each
// bucket is decided with the set it names, whatever the order: its
// numbers are those of a call of that bucket alone.
func TestScriptParameterSets(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	src := bucket.TokenBucketScript()
	u := redistest.Unique(t)
	sets := [][]any{set(5000, 1000), set(1000, 400), {"tb", 3000, 0.1, 2000, 60000, 500, 0}}
	// Buckets: the set (1-based) of each; the same set appears twice, not
	// next to each other, and the sets are named out of order.
	of := []int{2, 3, 1, 2}
	eval := func(keys []string, argv ...any) []int64 {
		t.Helper()
		res, err := c.Eval(ctx, src, keys, argv...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	const now = "1700000000000000"
	keys := make([]string, len(of))
	var tail []any
	for i, j := range of {
		keys[i] = "rl:v1:{g." + u + "}:together"
		tail = append(tail, j, fmt.Sprintf("s%d", i))
	}
	argv := scriptArgs("i", "0", sets, tail...)
	argv[1] = now
	got := eval(keys, argv...)
	if len(got) != 1+4*len(of) || fmt.Sprint(got[0]) != now {
		t.Fatalf("reply %v: want the instant %s, then 4 numbers per bucket", got, now)
	}
	for i, j := range of {
		argv := scriptArgs("i", "0", sets[j-1:j], 1, fmt.Sprintf("s%d", i))
		argv[1] = now
		want := eval([]string{"rl:v1:{g." + u + "}:alone"}, argv...)
		if fmt.Sprint(got[1+4*i:5+4*i]) != fmt.Sprint(want[1:]) {
			t.Errorf("bucket %d (set %d): %v in the shared call, %v alone", i, j, got[1+4*i:5+4*i], want[1:])
		}
	}
}
