package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// addNode starts another regional node of region of, on of's Redis (a
// region's nodes share its buckets) with its own link to etcd and its own
// load driver; a child node runs in a process of its own. It is labelled
// with the region's name and its number in the region ("a2").
func (e *env) addNode(of *region, child bool) *region {
	e.t.Helper()
	n := 1
	for _, d := range e.drivers {
		if d.target.Load().name == of.name {
			n++
		}
	}
	r := &region{e: e, name: of.name, label: fmt.Sprintf("%s%d", of.name, n), child: child, clk: &stepClock{},
		redis: of.redis, proxy: e.proxyToEtcd()}
	e.track(r)
	r.waitReady(15 * time.Second)
	return r
}

// nodes returns how many nodes of region are registered.
func (e *env) nodes(region string) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := e.cli.Get(ctx, layout.RegionNodes(region), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatalf("registrations of %s: %v", region, err)
	}
	return int(r.Count)
}

// TestRegionOfTwoNodes: region a runs two regional nodes on its one
// Redis, each seeing half of a's demand. Their demand is summed (a's share
// rises as with one node offering it all), both register under their own
// keys, and when one stops gracefully (its lease revoked) a keeps its
// share: the other node still enforces it. The replayed history keeps
// the invariant throughout.
func TestRegionOfTwoNodes(t *testing.T) {
	e := newEnv(t, 1, "a", "b", "c")
	a1 := e.regions[0]
	a2 := e.addNode(a1, false)
	if n := e.nodes("a"); n != 2 {
		t.Fatalf("region a has %d registered nodes, want 2", n)
	}
	a1.load.setRate(offeredRate / 2)
	a2.load.setRate(offeredRate / 2)
	above := func() bool {
		al, ok := e.alloc()
		return ok && share(al, "a") > 0.8 && a1.load.share() > 0.8 && a2.load.share() > 0.8
	}
	took := e.waitFor(10*rebalanceIv, "share above 0.8 in region a, enforced by both nodes", above)
	t.Logf("demand split over a's two nodes: share above 0.8 after %v", took.Round(time.Millisecond))
	held, _ := e.alloc()

	a2.load.close()
	a2.stop()
	if n := e.nodes("a"); n != 1 {
		t.Fatalf("after one node stopped, region a has %d registered nodes, want 1", n)
	}
	a1.load.setRate(offeredRate)
	time.Sleep(3 * rebalanceIv)
	now, _ := e.alloc()
	if share(now, "a") < share(held, "a")-1e-9 || a1.load.share() < share(held, "a")-1e-9 {
		t.Fatalf("a's share fell from %.3f to %.3f (node a1 enforces %.3f) after one of its two nodes stopped",
			share(held, "a"), share(now, "a"), a1.load.share())
	}
	t.Logf("after a's second node stopped: a's share %.3f (epoch %d), a1 enforces %.3f", share(now, "a"), now.Epoch, a1.load.share())
	e.replay()
}
