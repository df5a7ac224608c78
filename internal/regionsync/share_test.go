package regionsync

import (
	"encoding/json"
	"strconv"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// syncerWithTable returns an unstarted Syncer on clk (clock.Real when
// none) whose table holds policy p with n overrides, its lease just
// renewed.
func syncerWithTable(tb testing.TB, n int, clk ...clock.Clock) *Syncer {
	tb.Helper()
	over := map[string]map[string]float64{}
	for i := 0; i < n; i++ {
		over["s"+strconv.Itoa(i)] = map[string]float64{"eu": 0.5, "us": 0.5}
	}
	raw, _ := json.Marshal(alloc("p", 1, map[string]float64{"eu": 0.3, "us": 0.7}, map[string]float64{"eu": 0.1, "us": 0.1}, over))
	ps, err := compile("eu", "p", raw, n+1)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Region: "eu", Client: &clientv3.Client{}}
	if len(clk) > 0 {
		cfg.Clock = clk[0]
	}
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	s.lost, s.shares = false, sharesOf(map[string]*policyShares{"p": ps})
	s.tab.Store(build(false, s.shares, nil))
	s.lastOK.Store(int64(s.monoNow())) // a lease just renewed
	return s
}

// sharesOf holds allocs as a table does.
func sharesOf(allocs map[string]*policyShares) sharedShares {
	var sh sharedShares
	var copied [etcdlayout.Shards]bool
	for p, ps := range allocs {
		sh.set(p, ps, &copied)
	}
	return sh
}

func TestShareDoesNotAllocate(t *testing.T) {
	s := syncerWithTable(t, 100)
	allocs := testing.AllocsPerRun(1000, func() {
		if s.Share("p", "s7") != 0.5 || s.Share("p", "cold") != 0.3 || s.Share("q", "x") != 0 {
			t.Fatal("wrong share")
		}
	})
	if allocs != 0 {
		t.Fatalf("Share allocates %v times", allocs)
	}
}

func BenchmarkShare(b *testing.B) {
	s := syncerWithTable(b, 1000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if i&1 == 0 {
				s.Share("p", "s42")
			} else {
				s.Share("p", "cold")
			}
			i++
		}
	})
}
