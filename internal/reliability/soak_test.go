package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// soakPolicies: a per-tenant limit (the hot tenant and the one-request
// identities), weighted exports, and a per-window limit for the burst.
// Every idle TTL is the policy minimum, one minute.
const soakPolicies = `policies:
  - {name: api, capacity: 50, rate: 50/second, failure_mode: closed}
  - {name: exports, capacity: 200, rate: 100/second, failure_mode: local}
  - {name: window, algorithm: fixed_window, capacity: 100, window: 1s, failure_mode: open}
`

// p99Budget is the decision latency budget of the soak's steady traffic
// (the bursts queue 100 checks at once and are reported apart), over
// loopback gRPC with -race on a shared 2-core machine; without -race a
// decision takes well under a millisecond (scripts/bench-regional.sh).
const p99Budget = 50 * time.Millisecond

func redisInfo(t testing.TB, rc *redis.Client, field string) int64 {
	t.Helper()
	s, err := rc.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("INFO memory has no %s", field)
	return 0
}

func dbsize(t testing.TB, rc *redis.Client) int64 {
	t.Helper()
	n, err := rc.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSoak runs skewed traffic against a node on Redis, then idles past
// the idle TTL: node heap and Redis memory and keys return to baseline,
// nothing is lost, and the p99 decision latency stays in its budget.
func TestSoak(t *testing.T) {
	dur := pick(5*time.Second, 4*time.Minute)
	maxOneShot := pick(int64(3000), int64(200000))
	srv := redistest.Start(t)
	rc := srv.Client(t)
	n := startNode(t, []string{"-redis", srv.Addr, "-policies", writePolicies(t, soakPolicies),
		"-store-timeout", "250ms", "-region", "soak"}, nil)
	ctx := context.Background()
	call := func(req *quotav1.CheckRequest) (*quotav1.CheckResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return n.adm.Check(cctx, req)
	}
	// Warm up, then take the baseline.
	for i := 0; i < 50; i++ {
		if _, err := call(&quotav1.CheckRequest{Subject: "warmup", Policies: []string{"api"}, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	before := map[string]int64{"node_heap": heapAfterGC(), "redis_used_memory": redisInfo(t, rc, "used_memory"),
		"redis_keys": dbsize(t, rc), "goroutines": int64(runtime.NumGoroutine())}

	var lat, burstLat latencies
	var lost, total, hotAdmitted, hotDenied, oneShots atomic.Int64
	var mu sync.Mutex
	var bad []string
	do := func(req *quotav1.CheckRequest) *quotav1.CheckResponse {
		began := time.Now()
		r, err := call(req)
		if req.Policies[0] == "window" {
			burstLat.add(time.Since(began)) // queueing behind 99 others
		} else {
			lat.add(time.Since(began))
		}
		total.Add(1)
		if err != nil {
			lost.Add(1)
			mu.Lock()
			if len(bad) < 10 {
				bad = append(bad, err.Error())
			}
			mu.Unlock()
			return nil
		}
		return r
	}
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				f()
			}
		}()
	}
	// A very hot tenant from two clients that ignore Retry-After.
	for i := 0; i < 2; i++ {
		run(func() {
			if r := do(&quotav1.CheckRequest{Subject: "tenant-hot", Policies: []string{"api"}, Cost: 1}); r != nil {
				if r.Allowed {
					hotAdmitted.Add(1)
				} else {
					hotDenied.Add(1)
				}
			}
		})
	}
	// Many one-request identities (raw, hashed by the node).
	run(func() {
		k := oneShots.Add(1)
		if k > maxOneShot {
			time.Sleep(10 * time.Millisecond)
			return
		}
		do(&quotav1.CheckRequest{Subject: fmt.Sprintf("visitor %d <%d@example.org>", k, k), HashSubject: true, Policies: []string{"api"}, Cost: 1})
	})
	// Weighted costs on a few tenants.
	rng := rand.New(rand.NewPCG(1, 2))
	var rngMu sync.Mutex
	run(func() {
		rngMu.Lock()
		cost, tenant := int64(1+rng.IntN(20)), rng.IntN(5)
		rngMu.Unlock()
		do(&quotav1.CheckRequest{Subject: fmt.Sprintf("tenant-%d", tenant), Policies: []string{"exports", "api"}, Cost: cost})
		time.Sleep(2 * time.Millisecond)
	})
	// A synchronized burst at each window boundary: 100 tenants at once.
	bursts := 0
	var burstAdmitted atomic.Int64
	for time.Now().Add(time.Second).Before(end) {
		next := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next))
		var bw sync.WaitGroup
		for i := 0; i < 100; i++ {
			bw.Add(1)
			go func() {
				defer bw.Done()
				if r := do(&quotav1.CheckRequest{Subject: fmt.Sprintf("burst-%d", i%20), Policies: []string{"window"}, Cost: 1}); r != nil && r.Allowed {
					burstAdmitted.Add(1)
				}
			}()
		}
		bw.Wait()
		bursts++
		if bursts >= pick(4, 200) {
			break
		}
	}
	wg.Wait()
	during := map[string]int64{"node_heap": heapAfterGC(), "redis_used_memory": redisInfo(t, rc, "used_memory"), "redis_keys": dbsize(t, rc)}
	t.Logf("at the end of the load: %v", during)

	// Every key must carry a TTL no longer than the idle TTL (1 minute).
	var cursor uint64
	checkedTTL := 0
	for {
		ks, next, err := rc.Scan(ctx, cursor, "*", 500).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			if checkedTTL >= 2000 {
				break
			}
			ttl, err := rc.PTTL(ctx, k).Result()
			if err == nil && ttl != -2*time.Nanosecond && (ttl <= 0 || ttl > time.Minute+time.Second) {
				t.Errorf("key %s has TTL %v; every bucket must expire within its idle TTL", k, ttl)
			}
			checkedTTL++
		}
		if cursor = next; cursor == 0 || checkedTTL >= 2000 {
			break
		}
	}

	// Idle past the idle TTL, then everything is back to the baseline.
	waitFor(t, "Redis keys to expire to the baseline", 2*time.Minute, func() bool {
		time.Sleep(500 * time.Millisecond)
		return dbsize(t, rc) <= before["redis_keys"]
	})
	time.Sleep(time.Second)
	after := map[string]int64{"node_heap": heapAfterGC(), "redis_used_memory": redisInfo(t, rc, "used_memory"),
		"redis_keys": dbsize(t, rc), "goroutines": int64(runtime.NumGoroutine())}
	ok := true
	if after["node_heap"] > before["node_heap"]*3/2+4<<20 {
		ok = false
		t.Errorf("node heap %d after idling, baseline %d", after["node_heap"], before["node_heap"])
	}
	if after["redis_used_memory"] > before["redis_used_memory"]+1<<20 {
		ok = false
		t.Errorf("redis used_memory %d after idling, baseline %d", after["redis_used_memory"], before["redis_used_memory"])
	}
	if after["goroutines"] > before["goroutines"]+5 {
		ok = false
		t.Errorf("goroutines %d after idling, baseline %d", after["goroutines"], before["goroutines"])
	}
	p99 := lat.quantile(0.99)
	if p99 > p99Budget {
		ok = false
		t.Errorf("p99 decision latency %v over the budget %v", p99, p99Budget)
	}
	for _, b := range bad {
		t.Errorf("lost decision: %s", b)
	}
	if hotAdmitted.Load() == 0 || hotDenied.Load() == 0 {
		t.Errorf("hot tenant admitted %d denied %d: the load did not reach the limit", hotAdmitted.Load(), hotDenied.Load())
	}
	// The hot tenant may be admitted at most C + r·t over the run.
	bound := 50 + 50*time.Since(end.Add(-dur)).Seconds()
	if float64(hotAdmitted.Load()) > bound {
		t.Errorf("hot tenant admitted %d > %.0f", hotAdmitted.Load(), bound)
	}
	if burstAdmitted.Load() > int64(bursts)*20*100 {
		t.Errorf("bursts admitted %d", burstAdmitted.Load())
	}
	record(t, Entry{Kind: KindLoad, Name: fmt.Sprintf("soak %v: hot tenant, one-request identities, bursts, weighted costs", dur),
		Injected: true, Survived: ok && !t.Failed(), Lost: lost.Load(), InvariantChecks: 1, Before: before, After: after, P99: p99,
		Note: fmt.Sprintf("%d checks, %d one-shot identities, %d bursts (p99 %v), peak %d keys", total.Load(), min(oneShots.Load(), maxOneShot), bursts, burstLat.quantile(0.99), during["redis_keys"])})
}
