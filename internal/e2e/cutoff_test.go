package e2e

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
)

// TestCutOffRegion is must-show 3: region c holds most of the share when
// its connection to etcd is blackholed (its Redis and its clients still
// work) and demand moves to a. c falls back to its minimum share within
// its lease TTL, observed in the share of its own decisions; the
// coordinator publishes an allocation that gives c's share to the others
// only after c's lease expired in etcd plus the skew margin. When the
// connection heals c comes back under a new lease.
func TestCutOffRegion(t *testing.T) {
	e := newEnv(t, 1, "a", "b", "c")
	a, c := e.regions[0], e.regions[2]
	c.load.setRate(offeredRate)
	e.waitFor(10*rebalanceIv, "share above 0.9 in c", func() bool { return c.load.share() > 0.9 })
	held, _ := e.alloc()
	others := func(al etcdlayout.Allocation) float64 { return share(al, "a") + share(al, "b") }
	othersAtCut := others(held)

	// Watch c's registration (its one node's) from now on: its deletion is
	// the lease expiry.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := e.cli.Get(ctx, layout.RegionNodes("c"), clientv3.WithPrefix())
	if err != nil || len(g.Kvs) == 0 {
		t.Fatalf("registration of c: %v", err)
	}
	expired := make(chan time.Time, 1)
	wch := e.cli.Watch(ctx, layout.RegionNodes("c"), clientv3.WithPrefix(), clientv3.WithRev(g.Header.Revision+1))
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					select {
					case expired <- time.Now():
					default:
					}
				}
			}
		}
	}()
	_, remaining := c.leaseRemaining()

	cut := time.Now()
	if err := c.proxy.SetMode(faultproxy.Blackhole); err != nil {
		t.Fatal(err)
	}
	a.load.setRate(offeredRate)
	t.Logf("c cut off from etcd at share %.3f (epoch %d), its lease had %ds left; demand moves to a", share(held, "c"), held.Epoch, remaining)

	atMin := func(s float64) bool { return s >= 0 && s <= minShare+1e-9 }
	e.waitFor(regionTTL+5*time.Second, "fall back to the minimum in c", func() bool { return atMin(c.load.share()) })
	fell, _ := c.load.firstShareAfter(cut, atMin)
	fallback := fell.Sub(cut)
	t.Logf("c enforced its minimum %.2f %v after the cut (lease TTL %v)", minShare, fallback.Round(time.Millisecond), regionTTL)
	if fallback > regionTTL+500*time.Millisecond {
		t.Errorf("c fell back %v after the cut, want within its lease TTL %v (+500ms for observation)", fallback, regionTTL)
	}

	var expiry time.Time
	select {
	case expiry = <-expired:
	case <-time.After(regionTTL + 5*time.Second):
		t.Fatal("c's registration never expired")
	}
	t.Logf("c's lease expired in etcd %v after the cut, %v after c fell back", expiry.Sub(cut).Round(time.Millisecond), expiry.Sub(fell).Round(time.Millisecond))
	// c gives up its share by its own clock no later than etcd expires the
	// lease (it measures from the send of its last good keepalive); 100 ms
	// covers how late a decision can show it at 30 checks/s.
	if fell.After(expiry.Add(100 * time.Millisecond)) {
		t.Errorf("c fell back %v after its lease expired in etcd", fell.Sub(expiry))
	}

	var handed etcdlayout.Allocation
	e.waitFor(10*rebalanceIv+regionTTL, "allocation giving c's share to the others", func() bool {
		al, ok := e.alloc()
		if ok && others(al) > othersAtCut+1e-9 {
			handed = al
			return true
		}
		return false
	})
	// The first such epoch, from the history.
	var shrinks int
	for _, al := range e.allocHistory(policyName) {
		if al.Epoch <= held.Epoch {
			continue
		}
		if others(al) > othersAtCut+1e-9 {
			handed = al
			break
		}
		shrinks++
	}
	ho := handed.PublishedAt.Sub(cut)
	t.Logf("hand-over: epoch %d published %v after the cut (%v after the expiry; TTL + skew = %v); a %.3f b %.3f c %.3f; %d epochs before it kept the others at %.3f",
		handed.Epoch, ho.Round(time.Millisecond), handed.PublishedAt.Sub(expiry).Round(time.Millisecond), regionTTL+skewMargin,
		share(handed, "a"), share(handed, "b"), share(handed, "c"), shrinks, othersAtCut)
	if handed.PublishedAt.Before(expiry.Add(skewMargin - 50*time.Millisecond)) {
		t.Errorf("c's share handed over %v after its lease expired, want at least the skew margin %v", handed.PublishedAt.Sub(expiry), skewMargin)
	}
	if min := time.Duration(remaining)*time.Second + skewMargin; ho < min {
		t.Errorf("c's share handed over %v after the cut, want at least its remaining lease %ds + skew %v", ho, remaining, skewMargin)
	}
	if !handed.PublishedAt.After(fell) {
		t.Errorf("c's share handed over at %v, before c fell back at %v", handed.PublishedAt, fell)
	}

	// Healed: c registers under a new lease and serves published shares.
	if err := c.proxy.SetMode(faultproxy.Pass); err != nil {
		t.Fatal(err)
	}
	back := e.waitFor(15*time.Second, "c ready again", c.ready)
	t.Logf("c ready again %v after the connection healed", back.Round(time.Millisecond))
	e.replay()
}
