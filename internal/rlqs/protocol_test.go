package rlqs

import (
	"context"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/policy"
)

// rawStream opens a stream on r's connection and sends msgs; it returns
// the status the stream ends with (or OK when it is still open after the
// server handled every usage).
func rawStream(t *testing.T, r *region, msgs ...*rlqsv3.RateLimitQuotaUsageReports) codes.Code {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(r.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break
		}
	}
	_ = st.CloseSend()
	for {
		if _, err := st.Recv(); err != nil {
			return status.Code(err)
		}
	}
}

func usage(id map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
		NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// TestStreamRefusesBadInput: a first message without domain, a second
// domain, and oversize bucket ids close the stream with InvalidArgument;
// streams past MaxStreams are refused with ResourceExhausted.
func TestStreamRefusesBadInput(t *testing.T) {
	h := newHarness(t)
	r := h.region("eu", 1, 0, ClientConfig{}, func(c *Config) { c.MaxStreams = 1; c.MaxBucketIDBytes = 64 })
	acme := map[string]string{"tenant": "acme"}
	for name, msgs := range map[string][]*rlqsv3.RateLimitQuotaUsageReports{
		"no domain":  {{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(acme, 1, 0)}}},
		"two domain": {{Domain: "edge"}, {Domain: "other"}},
		"big id":     {{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"tenant": strings.Repeat("x", 100)}, 1, 0)}}},
		"empty id":   {{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(nil, 1, 0)}}},
		"empty key":  {{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"": "v"}, 1, 0)}}},
	} {
		if got := rawStream(t, r, msgs...); got != codes.InvalidArgument {
			t.Errorf("%s: stream ended with %v, want InvalidArgument", name, got)
		}
	}
	// One stream held: a second is refused.
	c := NewClient(ClientConfig{Domain: "edge", Clock: h.clk})
	if err := c.Connect(context.Background(), r.conn); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Allow(acme)
	before := r.srv.Reports()
	if err := c.Report(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the report", func() bool { return r.srv.Reports() > before })
	if got := rawStream(t, r, &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}); got != codes.ResourceExhausted {
		t.Errorf("a stream past the bound ended with %v, want ResourceExhausted", got)
	}
}

// TestAssignments walks one Envoy through the filter's behaviours: a
// bucket without assignment, whole-second token buckets, an unchanged
// assignment that keeps the Envoy's tokens, ALLOW_ALL for a descriptor
// without rule, no assignment for a window rule, abandon_action for an
// idle bucket and TTL 0 on drain.
func TestAssignments(t *testing.T) {
	h := newHarness(t)
	r := h.region("eu", 1, 1, ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll},
		func(c *Config) { c.IdleAfter = 5 * time.Second })
	c := r.clients[0]
	acme := map[string]string{"tenant": "acme"}
	free := map[string]string{"path": "other"}
	window := map[string]string{"path": "window"}
	if c.Allow(acme) {
		t.Fatal("a bucket without assignment admitted under DENY_ALL no-assignment behaviour")
	}
	c.Allow(free)
	c.Allow(window)
	h.clk.Advance(time.Second)
	r.round(t) // first reports: time_elapsed 1 s for acme; subscription
	c.mu.Lock()
	b := c.buckets[idKey(acme)]
	tb := b.strategy.GetTokenBucket()
	fb := c.buckets[idKey(free)].strategy.GetBlanketRule()
	wHas := c.buckets[idKey(window)].has
	c.mu.Unlock()
	if tb == nil || tb.GetFillInterval().AsDuration()%time.Second != 0 || tb.GetMaxTokens() == 0 {
		t.Fatalf("acme's assignment: %v", b.strategy)
	}
	if fb.String() != "ALLOW_ALL" {
		t.Errorf("a descriptor without rule got %v, want ALLOW_ALL", fb)
	}
	if wHas {
		t.Error("a window rule got an assignment; it cannot be leased")
	}
	// Spend the bucket, then a round with the same demand: the same
	// assignment, so the tokens stay spent.
	for c.Allow(acme) {
	}
	r.round(t)
	if c.Allow(acme) {
		t.Fatal("an unchanged assignment refilled the Envoy's bucket")
	}
	if got := value(r.srv.m.changes); got != 0 {
		t.Errorf("assignment changes %v, want 0", got)
	}
	// Idle for IdleAfter: abandoned.
	for range 6 {
		h.clk.Advance(time.Second)
		r.round(t)
	}
	if st := c.Stats(); st.Abandons == 0 || value(r.srv.m.abandoned) == 0 {
		t.Fatalf("idle buckets not abandoned: %+v", st)
	}
	// A new request subscribes again; then a drain expires its
	// assignment at once.
	c.Allow(acme)
	h.clk.Advance(time.Second)
	r.round(t)
	n := c.Responses()
	r.srv.Drain(context.Background())
	waitFor(t, "the drain", func() bool { return c.Responses() > n })
	before := c.Stats().Expired
	if c.Allow(acme) || c.Stats().Expired != before+1 {
		t.Fatalf("after a drain (TTL 0) the expired behaviour must decide: %+v", c.Stats())
	}
}

// TestHeldAbove: leases taken at a share hold back the acknowledgement of
// a smaller one until they end; the next round leases at the new share
// and the old lease counts only until the margin after.
func TestHeldAbove(t *testing.T) {
	h := newHarness(t)
	r := h.region("eu", 0.5, 1, ClientConfig{Domain: "edge", NoAssignment: DenyAll}, nil)
	c := r.clients[0]
	acme := map[string]string{"tenant": "acme"}
	for range 20 {
		c.Allow(acme)
	}
	h.clk.Advance(time.Second)
	r.round(t)
	now := h.clk.Now()
	at := func(f float64) func(string) float64 { return func(string) float64 { return f } }
	if got := r.srv.HeldAbove("edge.tenant", at(0.5)); !got.IsZero() {
		t.Fatalf("held above the share in force: %v", got)
	}
	want := now.Add(3*time.Second + time.Second) // TTL + margin
	if got := r.srv.HeldAbove("edge.tenant", at(0.25)); !got.Equal(want) {
		t.Fatalf("held above 0.25 until %v, want %v", got, want)
	}
	r.setShare(0.25)
	h.clk.Advance(time.Second)
	r.round(t)
	// The lease taken at 0.5 stays counted to its own end: an Envoy that
	// never receives the fresh assignment enforces the old one to its TTL.
	if got := r.srv.HeldAbove("edge.tenant", at(0.25)); !got.Equal(want) {
		t.Fatalf("after a fresh lease at 0.25, held until %v, want the old lease's end %v", got, want)
	}
	h.clk.Advance(3 * time.Second)
	r.round(t)
	if got := r.srv.HeldAbove("edge.tenant", at(0.25)); !got.IsZero() && got.After(h.clk.Now()) {
		t.Fatalf("after the old lease's end still held until %v", got)
	}
}

// TestTokenBucketFor: whole-second fill intervals, never above the rate.
func TestTokenBucketFor(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		per  uint32
		fill time.Duration
		ok   bool
	}{
		{9.7, 9, time.Second, true},
		{1, 1, time.Second, true},
		{0.4, 1, 3 * time.Second, true},
		{0.5, 1, 2 * time.Second, true},
		{1.0 / 61, 0, 0, false},
		{0, 0, 0, false},
	} {
		tb, ok := tokenBucketFor(tc.rate)
		if ok != tc.ok || ok && (tb.PerFill != tc.per || tb.Fill != tc.fill || tb.rate() > tc.rate+1e-12) {
			t.Errorf("tokenBucketFor(%v) = %+v, %v", tc.rate, tb, ok)
		}
	}
	if d := demandRate(3, 7, 0, 0, time.Second); d != 10 {
		t.Errorf("time_elapsed 0 on a first report: %v per second, want 10 (over the interval)", d)
	}
	if d := demandRate(3, 7, 0, 2*time.Second, time.Second); d != 5 {
		t.Errorf("time_elapsed 0 after 2 s measured: %v, want 5", d)
	}
	if d := demandRate(3, 7, 5*time.Second, 2*time.Second, time.Second); d != 2 {
		t.Errorf("time_elapsed 5 s: %v, want 2", d)
	}
}

// TestPolicyEditMovesLeases: after a policy edit (new limits, so a new
// key version) the next round resolves the bucket again, releases the
// lease on the old bucket and leases on the new one at the new rate.
func TestPolicyEditMovesLeases(t *testing.T) {
	h := newHarness(t)
	r := h.region("eu", 1, 1, ClientConfig{Domain: "edge", NoAssignment: DenyAll}, nil)
	c := r.clients[0]
	acme := map[string]string{"tenant": "acme"}
	for range 40 {
		c.Allow(acme)
	}
	h.clk.Advance(time.Second)
	r.round(t)
	rateOf := func() float64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.buckets[idKey(acme)].rate
	}
	if got := rateOf(); got < 12 {
		t.Fatalf("rate %v before the edit, want about 13 (30/s less the reserve, halved while the bucket settles)", got)
	}
	edited, err := policy.Parse("edge.yaml", []byte(strings.Replace(edgePolicies, "requests_per_unit: 30, burst: 60", "requests_per_unit: 10, burst: 20", 1)))
	if err != nil {
		t.Fatal(err)
	}
	h.set.Store(edited)
	for range 40 {
		c.Allow(acme)
	}
	h.clk.Advance(time.Second)
	r.round(t)
	if got := rateOf(); got > 9 || got == 0 {
		t.Fatalf("rate %v after the edit to 10/s, want at most 9", got)
	}
	if got := value(r.srv.m.leased); got > 9 {
		t.Fatalf("leased %v after the edit, want at most 9", got)
	}
}

// TestFairStart: the first Envoy of a bucket does not take the whole
// leasable rate at its subscription: three Envoys subscribing a round
// later, while the bucket's group settles, each get a token bucket at
// their first round rather than DENY_ALL (the first Envoy's old
// assignment still counts to its end, and every fresh one takes a
// burst), and all sum within the region's refill.
func TestFairStart(t *testing.T) {
	h := newHarness(t)
	r := h.region("eu", 1, 4, ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}, nil)
	acme := map[string]string{"tenant": "acme"}
	for range 60 {
		r.clients[0].Allow(acme)
	}
	h.clk.Advance(time.Second)
	r.round(t)
	for range 60 {
		for _, c := range r.clients {
			c.Allow(acme)
		}
	}
	h.clk.Advance(time.Second)
	r.round(t)
	for i, c := range r.clients {
		c.mu.Lock()
		bk := c.buckets[idKey(acme)]
		tb := bk != nil && bk.has && bk.strategy.GetTokenBucket() != nil
		c.mu.Unlock()
		if !tb {
			t.Errorf("Envoy %d has no token bucket after the second round: %+v", i, c.Stats())
		}
	}
	if got := refillInForce(h.clk.Now(), r.clients, acme); got > rlqsLimits.RefillPerSecond {
		t.Fatalf("refill in force %v, over the region's %v", got, rlqsLimits.RefillPerSecond)
	}
}
