package regionsync

import (
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/faultproxy"
)

// TestLeaseAgeIgnoresWallClockSteps: the node's wall clock is stepped back
// an hour while etcd is unreachable; the lease's age is read on the
// monotonic clock, so once a lease TTL has passed the region enforces its
// safe share, on the next check itself (not only after the loss-check
// ticker ran), and takes the published share again under a new lease
// once etcd is back.
func TestLeaseAgeIgnoresWallClockSteps(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.7, "us": 0.3}, map[string]float64{"eu": 0.2, "us": 0.2}, nil))
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	const ttl = 3 * time.Second
	// The node reaches etcd through a proxy that can cut it off (stopping
	// an embedded etcd revokes the leases as it closes, which the node
	// sees as its registration deleted, a lost lease of its own).
	proxy, err := faultproxy.Start(faultproxy.Config{Target: strings.TrimPrefix(srv.Endpoints[0], "http://"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	s, _ := startOn(t, []string{"http://" + proxy.Addr()}, Config{LeaseTTL: ttl, Clock: clk})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	if err := proxy.SetMode(faultproxy.Blackhole); err != nil {
		t.Fatal(err)
	}
	clk.Advance(-time.Hour)
	if got := s.Share("p", "x"); got != 0.7 {
		t.Fatalf("share %v right after the wall clock stepped back, want 0.7 (the lease is still young)", got)
	}
	clk.Advance(ttl)
	if got := s.Share("p", "x"); got != 0.2 {
		t.Fatalf("share %v on the first check a lease TTL later (monotonic), want the safe 0.2", got)
	}
	p := s.Begin()
	if got := p.Share("p", "x"); got != 0.2 {
		t.Fatalf("pinned share %v a lease TTL later, want the safe 0.2", got)
	}
	p.End()
	if s.Ready() || !s.Lost() || s.Losses() != 1 {
		t.Fatalf("ready %v, lost %v, losses %d after the lease expired on the monotonic clock", s.Ready(), s.Lost(), s.Losses())
	}
	// The check dropped the lease: once etcd is back, the node registers
	// under a new one and enforces the published share again.
	if err := proxy.SetMode(faultproxy.Pass); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "published share not back after etcd returned", func() bool {
		return s.Ready() && s.Share("p", "x") == 0.7
	})
	// The period at the safe share is remembered: a bucket created within
	// a refill time of it starts no fuller than the safe share.
	if got := s.LowestShare("p", "x", time.Minute); got != 0.2 {
		t.Fatalf("LowestShare over the last minute, which held a period without a lease, = %v, want 0.2", got)
	}
}

// TestCheckFindsExpiredLease: with no loss-check ticker running (as in a
// process that was paused and has just woken), the check itself finds the
// lease older than its TTL on the monotonic clock and switches to the safe
// share before it reads one.
func TestCheckFindsExpiredLease(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s := syncerWithTable(t, 1, clk)
	s.lease.Store(42)
	ttl := s.leaseTTL()
	clk.Advance(ttl - lossCheck(ttl) - time.Millisecond)
	if got := s.Share("p", "cold"); got != 0.3 {
		t.Fatalf("share %v just inside the lease, want 0.3", got)
	}
	clk.Advance(-time.Hour) // the wall clock steps back: no effect
	clk.Advance(2 * time.Millisecond)
	p := s.Begin()
	got := p.Share("p", "cold")
	p.End()
	if got != 0.1 {
		t.Fatalf("share %v past the lease TTL, want the safe 0.1", got)
	}
	if !s.Lost() || s.lease.Load() != 0 || s.Losses() != 1 {
		t.Fatalf("lost %v, lease %d, losses %d after the check found the lease expired", s.Lost(), s.lease.Load(), s.Losses())
	}
}

// TestReadinessFindsExpiredLease: Ready and Lost check the lease's age
// too, so a readiness probe does not report a node whose lease expired
// on the monotonic clock as ready before the loss check runs.
func TestReadinessFindsExpiredLease(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s := syncerWithTable(t, 1, clk)
	s.lease.Store(42)
	if !s.Ready() || s.Lost() {
		t.Fatal("not ready with a fresh lease")
	}
	clk.Advance(s.leaseTTL())
	if s.Ready() || !s.Lost() {
		t.Fatal("ready a lease TTL after the last keepalive")
	}
}
