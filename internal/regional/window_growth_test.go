package regional

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// TestWindowChargedAtLowestShareSinceItsStart: region eu holds share 0.2
// of a daily fixed window of 100, and a subject spends its 20. The share
// then grows to 0.8 in the middle of the window (the other region, which
// held 0.8, may already have spent it). The subject gets nothing more in
// this window, in any algorithm: a window's count is charged against the
// lowest share since the window began. Without it eu would admit 60 more
// and the two regions 160 in one window of 100.
func TestWindowChargedAtLowestShareSinceItsStart(t *testing.T) {
	g := newGrowthEnv(t, `
policies:
  - {name: daily, algorithm: fixed_window, capacity: 100, window: 24h, failure_mode: closed}
  - {name: sliding, algorithm: sliding_window, capacity: 100, window: 24h, failure_mode: closed}
  - {name: log, algorithm: sliding_log, capacity: 100, window: 24h, failure_mode: closed}
`)
	u := redistest.Unique(t)
	for _, p := range []string{"daily", "sliding", "log"} {
		putAllocation(t, g.cli, g.sync, p, 1, 0.2)
		if n, _ := g.drain(t, u, p); n != 20 {
			t.Fatalf("%s at share 0.2: admitted %d, want 20", p, n)
		}
		putAllocation(t, g.cli, g.sync, p, 2, 0.8)
		if n, _ := g.drain(t, u, p); n != 0 {
			t.Fatalf("%s after growing to 0.8 mid-window: admitted %d more, want 0 (the window was counted at 0.2)", p, n)
		}
	}
}

// steppedClock is the wall clock offset by what a test stepped it; its
// monotonic reading is the process's (clock.MonotonicOf), which a step
// does not move, as NTP stepping a host's clock.
type steppedClock struct{ offset atomic.Int64 }

func (c *steppedClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// TestWindowShareAfterNodeClockStepsBack: region eu holds share 0.2 of a
// daily fixed window of 100 and a subject spends its 20; the share grows
// to 0.8 in the middle of Redis's window (which Redis TIME aligns). Then the node's wall clock is stepped back to just after the
// start of its own day. The node must still charge the window's count at
// 0.2: the window in Redis began hours before the growth, whatever the
// node's clock says. Looking back only as far as the node's clock places
// the window's start (its position plus the 1 s skew allowance), it saw
// only the grown share and admitted 60 more.
func TestWindowShareAfterNodeClockStepsBack(t *testing.T) {
	const window = 24 * time.Hour
	clk := &steppedClock{}
	g := newGrowthEnvClock(t, `
policies:
  - {name: daily, algorithm: fixed_window, capacity: 100, window: 24h, failure_mode: closed}
`, clk)
	// Redis's window must have begun well before the growth.
	rc := redistest.Client(t)
	redisNow, err := rc.Time(ctxT(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if pos := redisNow.Sub(bucket.WindowStart(redisNow, window)); pos < 5*time.Second {
		time.Sleep(5*time.Second - pos)
	}
	u := redistest.Unique(t)
	putAllocation(t, g.cli, g.sync, "daily", 1, 0.2)
	if n, _ := g.drain(t, u, "daily"); n != 20 {
		t.Fatalf("at share 0.2: admitted %d, want 20", n)
	}
	putAllocation(t, g.cli, g.sync, "daily", 2, 0.8)
	time.Sleep(2500 * time.Millisecond)
	// The node's clock now reads 200 ms into its day: hours back.
	now := time.Now()
	clk.offset.Store(int64(bucket.WindowStart(now, window).Add(200 * time.Millisecond).Sub(now)))
	if n, _ := g.drain(t, u, "daily"); n != 0 {
		t.Fatalf("after the growth to 0.8 and the node's clock stepped back %v: admitted %d more, want 0 (Redis's window was counted at 0.2)",
			-time.Duration(clk.offset.Load()).Round(time.Second), n)
	}
}
