package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
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

// Decision latency budgets of the soak's steady traffic (client-side, over
// loopback gRPC, node and load generator in one process; the bursts queue
// 100 checks at once and are reported apart), per build mode. The load is
// closed-loop and saturates the machine on purpose (two hot-tenant clients
// and one stream of new identities without think time), so these figures
// are latencies at saturation on a shared 2-core machine, not the node's
// unloaded latency (scripts/bench-regional.sh measures that).
//
// Measured with `go test [-race] -run 'TestSoak$' ./internal/reliability/`
// (the CI form, 5 s of load), the soak alone in its binary while other
// users' work kept the load average between 1.6 and 6.3:
//
//	plain: p50 87-118 µs, p99 2.2-6.6 ms (9 runs)
//	-race: p50 1.5-3.4 ms, p99 6.9-34 ms (8 runs); 69 ms was seen
//	       with the whole project suite running beside it
//
// The spread follows the machine's load, not the node: the same binary
// gave race p99 6.9 and 13.8 ms minutes apart; the p99 of checks outside
// the bursts is the overall p99; CPU, mutex and block profiles of the
// plain soak show no node-side hot spot (node-side mutex wait under 1 ms
// over the whole run, the store call 120 µs on average, no pipeline
// linger, negative cache and breaker invisible in the CPU profile); GC
// runs about 30 times a second (15 KB allocated per check by client and
// node together) and GOGC=400 lowered p99 from 6.3 to 4.0 ms plain and
// from 19.9 to 16.7 ms under -race, the test's in-process client as much
// as the node. Calling the store inline instead of on a goroutine per
// Redis group changed nothing measurable. Each p99 budget is about three
// times the worst p99 measured alone; the p50 budgets leave 3 to 8 times
// the worst p50.
const (
	plainP50Budget = time.Millisecond
	plainP99Budget = 20 * time.Millisecond
	raceP50Budget  = 10 * time.Millisecond
	raceP99Budget  = 100 * time.Millisecond
)

// soakBudgets returns the p50 and p99 budgets of this build mode.
func soakBudgets() (mode string, p50, p99 time.Duration) {
	if raceEnabled {
		return "race", raceP50Budget, raceP99Budget
	}
	return "plain", plainP50Budget, plainP99Budget
}

// loadAverage is the one-minute load average, or "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

// burstPerTenant is how many checks each of the soak's two burst tenants
// sends at once, against a fixed window of 100.
const burstPerTenant = 150

// TestSoak runs skewed traffic against a node on Redis, then idles past
// the idle TTL: node heap and Redis memory and keys return to baseline,
// nothing is lost, and the p50 and p99 decision latencies stay inside the
// budgets of the build mode (plain or -race).
func TestSoak(t *testing.T) {
	dur := pick(5*time.Second, 4*time.Minute)
	maxOneShot := pick(int64(3000), int64(200000))
	srv := redistest.Start(t)
	rc := srv.Client(t)
	n := startNode(t, regional.DaemonConfig{Redis: srv.Addr, Policies: writePolicies(t, soakPolicies),
		StoreTimeout: 250 * time.Millisecond, Region: "soak"}, nil)
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
	before := map[string]int64{"node_heap": heapAfterGC(), "redis_used_memory": redistest.Info(t, rc, "memory", "used_memory"),
		"redis_keys": redistest.DBSize(t, rc), "goroutines": int64(runtime.NumGoroutine())}

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
	loadStart := loadAverage()
	began := time.Now()
	end := began.Add(dur)
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
	// A synchronized burst at each window boundary: 300 checks at once
	// from two tenants, 150 each against a window of 100. Admissions are
	// counted per tenant and window (the window's end is the decision's
	// time plus its reset), and no window may admit more than 100.
	bursts := 0
	var burstMu sync.Mutex
	burstWindows := map[string]int64{}
	var burstDenied atomic.Int64
	for time.Now().Add(time.Second).Before(end) {
		next := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next))
		var bw sync.WaitGroup
		for i := 0; i < 2*burstPerTenant; i++ {
			bw.Add(1)
			go func() {
				defer bw.Done()
				subject := fmt.Sprintf("burst-%d", i%2)
				r := do(&quotav1.CheckRequest{Subject: subject, Policies: []string{"window"}, Cost: 1})
				switch {
				case r == nil:
				case r.Allowed:
					windowEnd := time.Now().Add(r.ResetAfter.AsDuration()).Round(time.Second).Unix()
					burstMu.Lock()
					burstWindows[fmt.Sprintf("%s@%d", subject, windowEnd)]++
					burstMu.Unlock()
				default:
					burstDenied.Add(1)
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
	loadTook := time.Since(began)
	loadEnd := loadAverage()
	during := map[string]int64{"node_heap": heapAfterGC(), "redis_used_memory": redistest.Info(t, rc, "memory", "used_memory"), "redis_keys": redistest.DBSize(t, rc)}
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
		return redistest.DBSize(t, rc) <= before["redis_keys"]
	})
	time.Sleep(time.Second)
	after := map[string]int64{"node_heap": heapAfterGC(), "redis_used_memory": redistest.Info(t, rc, "memory", "used_memory"),
		"redis_keys": redistest.DBSize(t, rc), "goroutines": int64(runtime.NumGoroutine())}
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
	mode, p50Budget, p99Budget := soakBudgets()
	p50, p99 := lat.quantile(0.5), lat.quantile(0.99)
	if p50 > p50Budget || p99 > p99Budget {
		ok = false
		t.Errorf("%s build: decision latency p50 %v, p99 %v over the budgets %v, %v (load average %s at the start of the load, %s at its end)",
			mode, p50, p99, p50Budget, p99Budget, loadStart, loadEnd)
	}
	for _, b := range bad {
		t.Errorf("lost decision: %s", b)
	}
	if hotAdmitted.Load() == 0 || hotDenied.Load() == 0 {
		t.Errorf("hot tenant admitted %d denied %d: the load did not reach the limit", hotAdmitted.Load(), hotDenied.Load())
	}
	// The hot tenant may be admitted at most C + r·t over the load (not
	// the idle wait after it).
	invariantChecks := int64(1)
	bound := 50 + 50*loadTook.Seconds()
	if float64(hotAdmitted.Load()) > bound {
		ok = false
		t.Errorf("hot tenant admitted %d > C + r·t = %.0f over %v of load", hotAdmitted.Load(), bound, loadTook)
	}
	var burstAdmitted int64
	for w, n := range burstWindows {
		invariantChecks++
		burstAdmitted += n
		if n > 100 {
			ok = false
			t.Errorf("burst window %s admitted %d, its limit is 100", w, n)
		}
	}
	if bursts > 0 && burstDenied.Load() == 0 {
		ok = false
		t.Errorf("%d bursts of %d checks per tenant against a window of 100: none denied", bursts, burstPerTenant)
	}
	record(t, Entry{Kind: KindLoad, Name: fmt.Sprintf("soak %v: hot tenant, one-request identities, bursts, weighted costs", dur),
		Injected: true, Survived: ok && !t.Failed(), Lost: lost.Load(), InvariantChecks: invariantChecks, Before: before, After: after, P99: p99,
		Note: fmt.Sprintf("%s build: %d checks, p50 %v (budget %v), p99 budget %v; %d one-shot identities, %d bursts (%d admitted, p99 %v), peak %d keys; load average %s to %s",
			mode, total.Load(), p50.Round(time.Microsecond), p50Budget, p99Budget, min(oneShots.Load(), maxOneShot), bursts, burstAdmitted,
			burstLat.quantile(0.99).Round(time.Microsecond), during["redis_keys"], loadStart, loadEnd)})
}
