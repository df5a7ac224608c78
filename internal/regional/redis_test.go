package regional

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

func redisStore(t testing.TB, c bucket.RedisConn) bucket.Store {
	t.Helper()
	s, err := bucket.NewRedis(bucket.RedisConfig{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// concurrently runs f 500 times at once and counts true answers.
func concurrently(t *testing.T, f func() (bool, error)) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 500)
	start := make(chan struct{})
	for i := 0; i < 500; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ok, err := f()
			if err != nil {
				errs <- err
				return
			}
			if ok {
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return int(admitted.Load())
}

// TestMustShow1ExactUnderConcurrency: a policy of 100 per hour, 500
// concurrent checks for one subject over gRPC against real Redis admit
// exactly 100; with hits_addend (cost) 7, exactly 14. Through the Envoy API
// and the own API.
func TestMustShow1ExactUnderConcurrency(t *testing.T) {
	files := map[string]string{
		"envoy.yaml": "domain: ms1\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
		"own.yaml":   "policies:\n  - name: hourly\n    capacity: 100\n    rate: 100/hour\n    failure_mode: closed\n",
	}
	// A generous time budget: this test is about exactness, not latency,
	// and must not be decided by a failure mode on a loaded machine.
	h := startNode(t, Config{Store: redisStore(t, redistest.Client(t)), StoreTimeout: 10 * time.Second}, files)
	ctx := ctxT(t)
	for _, hits := range []uint32{1, 7} {
		want := 100 / int(hits)
		t.Run(fmt.Sprintf("envoy hits %d", hits), func(t *testing.T) {
			for attempt := 0; ; attempt++ {
				tenant := redistest.Unique(t)
				hour := time.Now().Truncate(time.Hour)
				got := concurrently(t, func() (bool, error) {
					r, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "ms1", HitsAddend: hits,
						Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", tenant)}})
					if err != nil {
						return false, err
					}
					if len(r.ResponseHeadersToAdd) > 0 {
						return false, fmt.Errorf("degraded decision: %v", r.ResponseHeadersToAdd)
					}
					return r.OverallCode == rlsv3.RateLimitResponse_OK, nil
				})
				if !time.Now().Truncate(time.Hour).Equal(hour) && attempt == 0 {
					continue // the fixed window turned over mid-test
				}
				if got != want {
					t.Fatalf("admitted %d of 500, want exactly %d", got, want)
				}
				return
			}
		})
		t.Run(fmt.Sprintf("own hits %d", hits), func(t *testing.T) {
			subject := redistest.Unique(t)
			got := concurrently(t, func() (bool, error) {
				r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"hourly"}, Cost: int64(hits)})
				if err != nil {
					return false, err
				}
				if r.Degraded != "" {
					return false, fmt.Errorf("degraded decision %q", r.Degraded)
				}
				return r.Allowed, nil
			})
			if got != want {
				t.Fatalf("admitted %d of 500, want exactly %d", got, want)
			}
		})
	}
}

// TestMustShow3RedisOutage: with Redis stopped, closed policies deny, open
// ones admit, local ones follow the local bucket, each fast while the
// breaker is open; after a restart normal decisions resume.
func TestMustShow3RedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	rc, err := redisClient(srv.Addr, 20*time.Millisecond, bucket.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	files := map[string]string{"own.yaml": `
policies:
  - {name: fopen, capacity: 1000, rate: 1000/hour, failure_mode: open}
  - {name: fclosed, capacity: 1000, rate: 1000/hour, failure_mode: closed}
  - {name: flocal, capacity: 10, rate: 10/hour, failure_mode: local, local_scale: 0.5}
`}
	// The time budget is generous so that a loaded test machine does not
	// degrade decisions before the outage; the cooldown outlasts the timed
	// checks, so none of them is the breaker's probe.
	const cooldown = 3 * time.Second
	h := startNode(t, Config{Store: redisStore(t, rc), StoreTimeout: 100 * time.Millisecond,
		BreakerThreshold: 3, BreakerCooldown: cooldown}, files)
	ctx := ctxT(t)
	subject := redistest.Unique(t)
	check := func(p string) (*quotav1.CheckResponse, time.Duration) {
		t.Helper()
		start := time.Now()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{p}})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return r, time.Since(start)
	}
	for _, p := range []string{"fopen", "fclosed", "flocal"} {
		if r, _ := check(p); !r.Allowed || r.Degraded != "" {
			t.Fatalf("%s before the outage: %v", p, r)
		}
	}

	srv.Stop()
	for i := 0; !h.node.brk.isOpen(); i++ {
		if i > 20 {
			t.Fatal("breaker never opened")
		}
		check("fopen")
	}
	// While the breaker is open a check must not reach the store: no
	// store call at all, and a median latency within the 10 ms target.
	callsOpen := h.store.calls.Load()
	var took []time.Duration
	timed := func(p string) *quotav1.CheckResponse {
		open := h.node.brk.retryIn(time.Now()) > 0
		r, d := check(p)
		if open && h.node.brk.retryIn(time.Now()) > 0 {
			took = append(took, d)
		}
		return r
	}
	for i := 0; i < 20; i++ {
		if r := timed("fclosed"); r.Allowed || r.Degraded != "closed" || r.RetryAfter.AsDuration() <= 0 {
			t.Fatalf("closed during the outage: %v", r)
		}
		if r := timed("fopen"); !r.Allowed || r.Degraded != "open" {
			t.Fatalf("open during the outage: %v", r)
		}
	}
	// local: share 1 × local_scale 0.5 × capacity 10 = 5 tokens, then deny.
	for i := 0; i < 8; i++ {
		r := timed("flocal")
		if r.Degraded != "local" || r.Allowed != (i < 5) || r.Limit != 5 {
			t.Fatalf("local check %d during the outage: %v", i, r)
		}
	}
	if calls := h.store.calls.Load() - callsOpen; calls != 0 {
		t.Errorf("%d store calls while the breaker was open", calls)
	}
	if len(took) < 40 {
		t.Fatalf("only %d of 48 checks ran with the breaker open", len(took))
	}
	slices.Sort(took)
	if median := took[len(took)/2]; median > 10*time.Millisecond {
		t.Errorf("median check %v while the breaker was open (slowest %v), target 10ms", median, took[len(took)-1])
	}
	if got := counterValue(t, h.reg, "quota_regional_degraded_decisions_total"); got < 48 {
		t.Fatalf("degraded decisions counted %v, want at least 48", got)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ := check("fclosed")
		if r.Degraded == "" {
			if !r.Allowed {
				t.Fatalf("closed after the restart: %v", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("normal decisions did not resume after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range []string{"fopen", "flocal"} {
		if r, _ := check(p); !r.Allowed || r.Degraded != "" {
			t.Fatalf("%s after the restart: %v", p, r)
		}
	}
}

// TestMustShow5VersionMigration: raising a policy's version, or its
// limits, moves its buckets to new keys; no decision after the reload
// reads the old bucket, which is left to expire by its TTL. The new
// buckets start spent (the key is younger than a refill time: the subject
// may have spent its budget under the old one, bucket.Request.Since), so
// the first check after the edit is denied at the new limit.
func TestMustShow5VersionMigration(t *testing.T) {
	rc := redistest.Client(t)
	subject := redistest.Unique(t)
	v1 := "policies:\n  - {name: mig, version: 1, capacity: 3, rate: 3/hour, failure_mode: closed}\n"
	h := startNode(t, Config{Store: redisStore(t, rc), StoreTimeout: 10 * time.Second}, map[string]string{"p.yaml": v1})
	ctx := ctxT(t)
	check := func() *quotav1.CheckResponse {
		t.Helper()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"mig"}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := 0; i < 4; i++ {
		if r := check(); r.Allowed != (i < 3) {
			t.Fatalf("v1 check %d: %v", i, r)
		}
	}
	p1, _ := h.node.Policies().Get("mig")
	oldKey, _ := bucket.NewKey("mig", p1.KeyVersion(), subject)
	// Whatever the store's Redis layout, every key of the old version
	// starts with "rl:v<old version>:"; remember their contents.
	oldState := func() map[string]string {
		keys, err := rc.Keys(ctx, fmt.Sprintf("rl:v%d:*", oldKey.Version())).Result()
		if err != nil || len(keys) == 0 {
			t.Fatalf("old buckets not in Redis: %v, %v", keys, err)
		}
		out := map[string]string{}
		for _, k := range keys {
			d, err := rc.Dump(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			out[k] = d
			if ttl, err := rc.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
				t.Fatalf("old key %s TTL %v, %v: it must expire by itself", k, ttl, err)
			}
		}
		return out
	}
	before := oldState()

	for _, step := range []struct {
		name, yaml string
		limit      int64
	}{
		{"version raised", "policies:\n  - {name: mig, version: 2, capacity: 3, rate: 3/hour, failure_mode: closed}\n", 3},
		{"limits raised", "policies:\n  - {name: mig, version: 2, capacity: 5, rate: 5/hour, failure_mode: closed}\n", 5},
	} {
		seenBefore := len(h.store.seen())
		if err := writeFile(h.dir, "p.yaml", step.yaml); err != nil {
			t.Fatal(err)
		}
		if err := h.node.LoadPolicies(h.dir); err != nil {
			t.Fatal(err)
		}
		r := check()
		if r.Allowed || r.Limit != step.limit || r.Remaining != 0 {
			t.Fatalf("%s: first check %v, want a new bucket at limit %d that starts spent", step.name, r, step.limit)
		}
		for _, k := range h.store.seen()[seenBefore:] {
			if k.Version() == oldKey.Version() {
				t.Fatalf("%s: a decision read the old bucket %s", step.name, k)
			}
		}
	}
	after := oldState()
	for k, d := range before {
		if after[k] != d {
			t.Fatalf("old key %s changed after the migration", k)
		}
	}
}

func BenchmarkCheckBreakerOpen(b *testing.B) {
	srv := redistest.Start(b)
	rc, err := redisClient(srv.Addr, 5*time.Millisecond, bucket.DialOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rc.Close() })
	files := map[string]string{"own.yaml": "policies:\n  - {name: fclosed, capacity: 1000, rate: 1000/hour, failure_mode: closed}\n"}
	h := startNode(b, Config{Store: redisStore(b, rc), BreakerThreshold: 1, BreakerCooldown: time.Hour}, files)
	srv.Stop()
	ctx := context.Background()
	req := &quotav1.CheckRequest{Subject: "bench", Policies: []string{"fclosed"}}
	h.adm.Check(ctx, req)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := h.adm.Check(ctx, req)
		if err != nil || r.Degraded != "closed" {
			b.Fatal(r, err)
		}
	}
}
