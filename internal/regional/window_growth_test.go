package regional

import (
	"testing"

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
