package rebalance

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// TestRetiredRegionReadFromEtcd: a region that ran once stays in every
// allocation after its nodes are gone for good, and its minimum with it:
// minimums that sum above 1 with it stop every round. Once an operator
// retires it (retired/{region}), the round leaves it out and publishes.
func TestRetiredRegionReadFromEtcd(t *testing.T) {
	e := newEnv(t, "a", "b", "old")
	ctx := context.Background()
	autoAck(t, e.regions["a"], e.regions["b"])
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", SkewMargin: 100 * time.Millisecond})
	waitLeader(t, l)
	if a := roundStable(t, e, l); len(a.Default) != 3 {
		t.Fatalf("first allocation %v, want a, b and old", a.Default)
	}
	e.regions["old"].Kill()
	waitFor(t, "old's registration to go", 10*time.Second, func() bool {
		resp, err := e.cli.Get(ctx, e.layout.RegionNodes("old"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	ctl, _ := json.Marshal(etcdlayout.Control{Minimums: map[string]float64{"a": 0.3, "b": 0.3, "old": 0.5}})
	if _, err := e.cli.Put(ctx, e.layout.Control("exports"), string(ctl)); err != nil {
		t.Fatal(err)
	}
	res, err := l.RebalanceNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Published) != 0 || len(res.Waiting) == 0 {
		t.Fatalf("minimums summing to 1.1: published %v, notes %v", res.Published, res.Waiting)
	}
	r, _ := json.Marshal(etcdlayout.RetiredRegion{At: time.Now(), Actor: "test"})
	if _, err := e.cli.Put(ctx, e.layout.Retired("old"), string(r)); err != nil {
		t.Fatal(err)
	}
	var a etcdlayout.Allocation
	waitFor(t, "an allocation without the retired region", 10*time.Second, func() bool {
		if _, err := l.RebalanceNow(ctx); err != nil {
			t.Fatal(err)
		}
		a = e.alloc(t)
		_, held := a.Default["old"]
		return !held && a.Phase == etcdlayout.PhaseStable
	})
	if a.Default["a"] < 0.3 || a.Default["b"] < 0.3 {
		t.Fatalf("after retiring old: %v", a.Default)
	}
}
