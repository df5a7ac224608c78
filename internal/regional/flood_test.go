package regional

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestIdentityFloodRedisFull floods a node with a million distinct
// subjects of a fail-open policy against a Redis with a small maxmemory
// and noeviction. Redis fills and answers OOM; that is a store refusing to
// grow, not a store failure: the breaker stays closed, no store error is
// counted, and the fail-open policy admits no subject beyond its limits
// (each subject once, at most the live-subject bound of them, plus the
// overflow bucket's capacity).
func TestIdentityFloodRedisFull(t *testing.T) {
	const (
		flood    = 1_000_000
		maxLive  = 20_000
		capacity = 5
		workers  = 4
	)
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	rc := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Room for a few thousand buckets above what Redis holds at rest,
	// well under the node's live-subject bound.
	used := redistest.Info(t, rc, "memory", "used_memory")
	if err := rc.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+1<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	// Generous time budgets: on a loaded machine (-race, other tests) a
	// slow Redis call is a real store failure, which this test is not
	// about.
	conn, err := redisClient(srv.Addr, time.Second, bucket.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := startNode(t, Config{Store: redisStore(t, conn), StoreTimeout: 5 * time.Second,
		BreakerThreshold: 2, BreakerCooldown: 200 * time.Millisecond, MaxLiveSubjects: maxLive},
		map[string]string{"p.yaml": "policies:\n  - {name: open, capacity: 5, rate: 5/hour, failure_mode: open}\n"})
	adm := &admission{n: h.node}
	var admitted, sent, errs, degradedAdmits atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			req := &quotav1.CheckRequest{Policies: []string{"open"}, Cost: 1}
			for i := w; i < flood && ctx.Err() == nil; i += workers {
				req.Subject = "f" + strconv.Itoa(i)
				r, err := adm.Check(ctx, req)
				sent.Add(1)
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case r.Allowed:
					admitted.Add(1)
					if r.Degraded != "" {
						degradedAdmits.Add(1)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the flood did not finish in time: %d of %d checks sent", sent.Load(), flood)
	}
	if errs.Load() > 0 {
		t.Errorf("%d checks failed; first: %v", errs.Load(), firstErr.Load())
	}
	if opens := h.node.brk.opens.Load(); opens != 0 {
		t.Errorf("the flood opened the breaker %d times", opens)
	}
	if got := counterValue(t, h.reg, "quota_regional_store_errors_total"); got != 0 {
		t.Errorf("store_errors_total = %v, want 0 (an OOM reply is not a store failure)", got)
	}
	if got := counterValue(t, h.reg, "quota_regional_memory_full_total"); got == 0 {
		t.Errorf("Redis never refused a write (%d keys): the flood did not fill it", redistest.DBSize(t, rc))
	}
	if bound := int64(maxLive + capacity); admitted.Load() > bound {
		t.Errorf("a fail-open policy admitted %d of %d new subjects, bound %d", admitted.Load(), flood, bound)
	}
	keys := redistest.DBSize(t, rc)
	if degradedAdmits.Load() > 0 {
		t.Errorf("%d checks admitted by a failure mode", degradedAdmits.Load())
	}
	t.Logf("%d checks: %d admitted, %d keys in Redis, memory_full %v", sent.Load(), admitted.Load(), keys,
		counterValue(t, h.reg, "quota_regional_memory_full_total"))
}

// TestLiveSubjectsOverflow: a policy's new subjects beyond its live-subject
// bound share one overflow bucket with the policy's limits, so a flood of
// new subjects is admitted at most one capacity; live subjects keep their
// own buckets; a subject whose bucket could have expired frees its place.
func TestLiveSubjectsOverflow(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	h := startNode(t, Config{Store: memoryStore(t, clk), Clock: clk, MaxLiveSubjects: 3},
		map[string]string{"p.yaml": "policies:\n  - {name: pol, capacity: 2, rate: 2/minute}\n"})
	ctx := ctxT(t)
	allowed := func(subject string) bool {
		t.Helper()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"pol"}, Cost: 1})
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		return r.Allowed
	}
	for _, s := range []string{"a", "b", "c"} {
		if !allowed(s) {
			t.Fatalf("%s below the bound was denied", s)
		}
	}
	admitted := 0
	for i := 0; i < 100; i++ {
		if allowed("flood" + strconv.Itoa(i)) {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("100 new subjects beyond the bound: %d admitted, want the overflow bucket's capacity 2", admitted)
	}
	if got := counterValue(t, h.reg, "quota_regional_subject_overflow_total"); got != 100 {
		t.Errorf("subject_overflow_total = %v, want 100", got)
	}
	if !allowed("a") {
		t.Error("a live subject lost its own bucket to the flood")
	}
	// One full refill later every bucket could have expired: new subjects
	// get buckets of their own again.
	clk.Advance(2 * time.Minute)
	for _, s := range []string{"x", "y"} {
		first, second, third := allowed(s), allowed(s), allowed(s)
		if !first || !second || third {
			t.Errorf("%s after the live subjects expired: want its own bucket of 2", s)
		}
	}
}

// TestIPv6SubjectsAggregate: IPv6 subjects of an "ip" policy and Envoy
// remote_address values are charged per /64 (Config.IPv6SubjectPrefix), so
// a client cannot take a fresh bucket per address of its network.
func TestIPv6SubjectsAggregate(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{
		"p.yaml": "policies:\n  - {name: per-ip, subject: ip, capacity: 2, rate: 2/hour}\n",
		"e.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
	})
	ctx := ctxT(t)
	own := 0
	for i := 0; i < 10; i++ {
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "2001:db8:1:2::" + strconv.FormatInt(int64(i+1), 16), Policies: []string{"per-ip"}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			own++
		}
	}
	envoy := 0
	for i := 0; i < 10; i++ {
		r, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("remote_address", "2001:db8:1:2:"+strings.Repeat("f", i%4+1)+"::1")}})
		if err != nil {
			t.Fatal(err)
		}
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			envoy++
		}
	}
	if own != 2 || envoy != 2 {
		t.Errorf("ten addresses of one /64: own API admitted %d, Envoy %d; want 2 each", own, envoy)
	}
	r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "2001:db8:1:3::1", Policies: []string{"per-ip"}})
	if err != nil || !r.Allowed {
		t.Errorf("another /64: %v, %v; want admitted", r, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"192.0.2.7", "192.0.2.7"},
		{"fe80::1%eth0", "fe80::/64"},
		{"tenant-a", "tenant-a"},
	} {
		if got := ipSubject(tc.in, 64); got != tc.want {
			t.Errorf("ipSubject(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestIPv6PrefixBound: a prefix length above 128 is refused (the flags
// are parsed in cmd/regional, TestParse).
func TestIPv6PrefixBound(t *testing.T) {
	if _, err := New(Config{Region: "r", Store: memoryStore(t, clock.Real{}), Local: memoryStore(t, clock.Real{}), IPv6SubjectPrefix: 129}); err == nil {
		t.Error("IPv6SubjectPrefix 129 accepted")
	}
}

// TestShardedSubjectSetBound: a bound split into shards still holds: of
// many new subjects, exactly the bound get buckets of their own (every
// shard fills), the rest overflow.
func TestShardedSubjectSetBound(t *testing.T) {
	const bound = 4096
	s := newSubjectSet(bound, time.Minute)
	if len(s.shards) != subjectShards {
		t.Fatalf("%d shards for a bound of %d", len(s.shards), bound)
	}
	now := time.Unix(1_700_000_000, 0)
	own := 0
	for i := 0; i < 20*bound; i++ {
		if v, _ := s.admit("s"+strconv.Itoa(i), now); v == subjectOwn {
			own++
		}
	}
	if own != bound {
		t.Errorf("%d of %d new subjects got their own bucket, want the bound %d", own, 20*bound, bound)
	}
}
