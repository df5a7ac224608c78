package regional

import (
	"fmt"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

func cappedMemory(t testing.TB, maxBuckets int) *bucket.Memory {
	t.Helper()
	m, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clock.Real{}, MaxBuckets: maxBuckets})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLocalStoreFullDenies: during a Redis outage, a local policy whose
// in-process buckets are at their cap denies a check that needs a new
// bucket with a retry-after (a degraded decision), never an error; the
// subjects that already have a local bucket keep deciding from it.
func TestLocalStoreFullDenies(t *testing.T) {
	const localCap = 4
	srv := redistest.Start(t)
	rc, err := redisClient(srv.Addr, 20*time.Millisecond, bucket.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	h := startNode(t, Config{Store: redisStore(t, rc), Local: cappedMemory(t, localCap), StoreTimeout: 100 * time.Millisecond,
		BreakerThreshold: 1, BreakerCooldown: 5 * time.Second}, map[string]string{"p.yaml": `
policies:
  - {name: loc, capacity: 3, rate: 3/hour, failure_mode: local}
`})
	ctx := ctxT(t)
	srv.Stop()
	type want struct {
		allowed bool
		retry   bool
	}
	for i, tt := range []struct {
		subject string
		want
	}{
		{"s0", want{true, false}}, {"s1", want{true, false}}, {"s2", want{true, false}}, {"s3", want{true, false}},
		{"s4", want{false, true}}, {"s5", want{false, true}}, // cap reached: new buckets denied
		{"s0", want{true, false}}, {"s0", want{true, false}}, // an existing local bucket keeps deciding
		{"s0", want{false, true}}, // and denies once empty
		{"s6", want{false, true}},
	} {
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: tt.subject, Policies: []string{"loc"}, Cost: 1})
		if err != nil {
			t.Fatalf("check %d (%s): %v", i, tt.subject, err)
		}
		if r.Allowed != tt.allowed || r.Degraded != "local" || (r.RetryAfter.AsDuration() > 0) != tt.retry {
			t.Errorf("check %d (%s): allowed=%v degraded=%q retry=%v, want allowed=%v degraded local retry=%v",
				i, tt.subject, r.Allowed, r.Degraded, r.RetryAfter.AsDuration(), tt.allowed, tt.retry)
		}
	}
	if got := counterValue(t, h.reg, "quota_regional_memory_full_total"); got != 3 {
		t.Errorf("memory_full_total = %v, want 3", got)
	}
	if got := counterValue(t, h.reg, "quota_regional_degraded_decisions_total"); got != 10 {
		t.Errorf("degraded_decisions_total = %v, want 10", got)
	}
}

// TestPrimaryMemoryFullKeepsBreakerClosed: on a node whose primary store
// is the in-process one, a flood of new subjects at the bucket cap is
// denied check by check (degraded closed, with a retry-after) and never
// opens the breaker, so a fail-open policy keeps denying a subject whose
// bucket is empty.
func TestPrimaryMemoryFullKeepsBreakerClosed(t *testing.T) {
	const maxBuckets = 5
	h := startNode(t, Config{Store: cappedMemory(t, maxBuckets), BreakerThreshold: 2, BreakerCooldown: 10 * time.Second},
		map[string]string{"p.yaml": "policies:\n  - {name: op, capacity: 2, rate: 2/hour, failure_mode: open}\n"})
	ctx := ctxT(t)
	check := func(subject string, cost int64) *quotav1.CheckResponse {
		t.Helper()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"op"}, Cost: cost})
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		return r
	}
	if r := check("victim", 2); !r.Allowed || r.Degraded != "" {
		t.Fatalf("victim's first check: %v", r)
	}
	denied := 0
	for i := 0; i < 3*maxBuckets; i++ {
		r := check(fmt.Sprintf("flood-%d", i), 1)
		switch {
		case i < maxBuckets-1:
			if !r.Allowed || r.Degraded != "" {
				t.Errorf("flood %d below the cap: %v", i, r)
			}
		default:
			denied++
			if r.Allowed || r.Degraded != "closed" || r.RetryAfter.AsDuration() <= 0 {
				t.Errorf("flood %d at the cap: allowed=%v degraded=%q retry=%v, want a closed denial with a retry-after",
					i, r.Allowed, r.Degraded, r.RetryAfter.AsDuration())
			}
		}
	}
	if r := check("victim", 1); r.Allowed || r.Degraded != "" {
		t.Errorf("victim after the flood: allowed=%v degraded=%q, want a normal denial", r.Allowed, r.Degraded)
	}
	if r := check("flood-0", 1); !r.Allowed || r.Degraded != "" {
		t.Errorf("an existing bucket after the flood: %v", r)
	}
	if opens := h.node.brk.opens.Load(); opens != 0 || h.node.brk.isOpen() {
		t.Errorf("breaker opened %d times because the in-process store was full", opens)
	}
	if got := counterValue(t, h.reg, "quota_regional_store_errors_total"); got != 0 {
		t.Errorf("store_errors_total = %v, want 0", got)
	}
	if got := counterValue(t, h.reg, "quota_regional_memory_full_total"); got != float64(denied) {
		t.Errorf("memory_full_total = %v, want %d", got, denied)
	}
}
