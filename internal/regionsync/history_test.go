package regionsync

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// TestLowestShareFollowsHistory: the region's share of p goes 0.2, then
// 0.8 with subject "hot" overridden at 0.9 and "cold" at 0.05. Within the
// next ten minutes, LowestShare is 0.2 for a subject without an override,
// and the least of its shares for one with (0.05 for cold, 0.2 for hot);
// ten minutes later only the current shares count.
func TestLowestShareFollowsHistory(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.2, "us": 0.8}, map[string]float64{"eu": 0.1, "us": 0.1}, nil))
	s, _ := start(t, srv, Config{LeaseTTL: time.Hour, Clock: clk})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	if got := s.LowestShare("p", "x", 10*time.Minute); got != 0.2 {
		t.Fatalf("LowestShare at the first allocation = %v, want 0.2 (history starts at the first read)", got)
	}
	clk.Advance(time.Minute)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 2, map[string]float64{"eu": 0.8, "us": 0.2}, map[string]float64{"eu": 0.1, "us": 0.1},
		map[string]map[string]float64{"hot": {"eu": 0.9, "us": 0.1}, "cold": {"eu": 0.05, "us": 0.95}}))
	waitFor(t, 5*time.Second, "epoch 2 not applied", func() bool { return s.Share("p", "x") == 0.8 })
	clk.Advance(time.Minute)
	for _, tc := range []struct {
		subject string
		within  time.Duration
		want    float64
	}{
		{"x", 10 * time.Minute, 0.2},
		{"x", 30 * time.Second, 0.8}, // epoch 1 ended a minute ago
		{"x", 0, 0.8},
		{"hot", 10 * time.Minute, 0.2},
		{"cold", 10 * time.Minute, 0.05},
		{"x", time.Minute + time.Millisecond, 0.2},
	} {
		if got := s.LowestShare("p", tc.subject, tc.within); got != tc.want {
			t.Errorf("LowestShare(p, %s, %v) = %v, want %v", tc.subject, tc.within, got, tc.want)
		}
	}
	if got := s.LowestShare("q", "x", 10*time.Minute); got != 0 {
		t.Errorf("LowestShare of a policy without allocation = %v, want 0", got)
	}
	clk.Advance(10 * time.Minute)
	if got := s.LowestShare("p", "x", 10*time.Minute); got != 0.8 {
		t.Errorf("LowestShare ten minutes after the growth = %v, want 0.8", got)
	}
}

// TestShareHistoryIsBounded: a policy that changes every minute keeps at
// most maxShareHistory versions; the oldest merge, so the lowest share
// of the merged ones still counts (for every subject).
func TestShareHistoryIsBounded(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s := syncerWithTable(t, 0, clk)
	s.allocsRead = true
	prev := s.shares.get("p")
	for e := uint64(2); e < 40; e++ {
		clk.Advance(time.Minute)
		share := 0.5
		if e == 3 {
			share = 0.01 // one low epoch, long merged into older ones by the end
		}
		next := &policyShares{epoch: e, valid: true, ackable: true, hasDef: true, def: share, hasSafe: true, safe: 0.1}
		s.carryHistory("p", next, prev, s.monoNow())
		prev = next
	}
	if n := len(prev.hist); n != maxShareHistory {
		t.Fatalf("%d versions kept, want %d", n, maxShareHistory)
	}
	s.shares = sharesOf(map[string]*policyShares{"p": prev})
	s.tab.Store(build(false, s.shares, nil))
	s.lastOK.Store(int64(s.monoNow())) // a lease just renewed
	if got := s.LowestShare("p", "x", 2*time.Hour); got != 0.01 {
		t.Fatalf("LowestShare over the whole history = %v, want the merged 0.01", got)
	}
	if got := s.LowestShare("p", "x", 10*time.Minute); got != 0.5 {
		t.Fatalf("LowestShare over the last 10 minutes = %v, want 0.5", got)
	}
}
