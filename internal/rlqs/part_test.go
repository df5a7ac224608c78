package rlqs

import (
	"testing"

	"github.com/quotacoord/quota/bucket"
)

// TestNodesSplitByPart: two nodes of one region lease one bucket (one
// store), each with two Envoys offered 40 requests per second. Each node
// offers its Envoys its part of the leasable rate (Config.Part: 0.8 and
// 0.2, as the nodes' demand reports would say), so both nodes' Envoys
// get assignments, in proportion; with every node offering the whole rate
// the node whose round runs first takes it all and the other's Envoys get
// DENY_ALL.
func TestNodesSplitByPart(t *testing.T) {
	h := newHarness(t)
	shared, err := bucket.NewMemory(bucket.MemoryConfig{Clock: h.clk})
	if err != nil {
		t.Fatal(err)
	}
	ccfg := ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}
	node := func(name string, part float64) *region {
		return h.region(name, 1, 2, ccfg, func(c *Config) {
			c.Store = shared
			c.Part = func(string, string) float64 { return part }
		})
	}
	a, b := node("a", 0.8), node("b", 0.2)
	run := &rlqsRun{h: h, id: map[string]string{"tenant": "acme"}}
	cs := append(append([]*Client(nil), a.clients...), b.clients...)
	for s := range 200 { // 20 s
		run.offer(cs, []float64{40, 40, 40, 40})
		if s%10 == 9 {
			a.round(t)
			b.round(t)
		}
	}
	now := h.clk.Now()
	ra, rb := refillInForce(now, a.clients, run.id), refillInForce(now, b.clients, run.id)
	leasable := rlqsLimits.RefillPerSecond * (1 - DefaultReserve)
	t.Logf("assignments in force: node a's Envoys %.1f tokens/s, node b's %.1f (leasable %.1f)", ra, rb, leasable)
	if ra+rb > rlqsLimits.RefillPerSecond {
		t.Errorf("the Envoys' assignments refill %.1f tokens/s, over the region's %v", ra+rb, rlqsLimits.RefillPerSecond)
	}
	if ra < 0.6*leasable || rb < 3 {
		t.Errorf("node a's Envoys %.1f tokens/s, node b's %.1f: want about 0.8 and 0.2 of %.1f", ra, rb, leasable)
	}
	run.check(t)
}
