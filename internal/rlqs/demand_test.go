package rlqs

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/demand"
)

// TestUsageReachesDemand: what an Envoy reports for a leased bucket is the
// region's demand for the policy and subject (the coordinator moves the
// region's share with it): allowed requests admitted, denied ones offered,
// the subject pressured while some are denied.
func TestUsageReachesDemand(t *testing.T) {
	h := newHarness(t)
	rec, err := demand.New(demand.Config{Clock: h.clk})
	if err != nil {
		t.Fatal(err)
	}
	r := h.region("eu", 1, 1, ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll},
		func(c *Config) { c.Demand = rec })
	c := r.clients[0]
	id := map[string]string{"tenant": "acme"}
	var allowed, denied int
	for range 30 {
		for range 50 { // 50 requests in 100 ms: 500/s, far above 30/s
			if c.Allow(id) {
				allowed++
			} else {
				denied++
			}
		}
		h.clk.Advance(100 * time.Millisecond)
		if h.clk.Now().Sub(t0)%time.Second == 0 {
			r.round(t)
		}
	}
	r.round(t)
	snap := rec.Snapshot(h.clk.Now())
	pd, ok := snap["edge.tenant"]
	if !ok {
		t.Fatalf("no demand recorded for edge.tenant: %v", snap)
	}
	secs := h.clk.Now().Sub(t0).Seconds()
	if got, want := pd.Offered*secs, float64(allowed+denied); got < want-0.5 || got > want+0.5 {
		t.Errorf("offered %.1f requests, the Envoy saw %v", got, want)
	}
	if got := pd.Admitted * secs; got < float64(allowed)-0.5 || got > float64(allowed)+0.5 {
		t.Errorf("admitted %.1f requests, the Envoy allowed %d", got, allowed)
	}
	if len(pd.Pressured) != 1 || pd.Pressured[0].Subject != "acme" || !pd.Pressured[0].Denied {
		t.Errorf("pressured subjects %+v, want acme, denied", pd.Pressured)
	}
	t.Logf("Envoy allowed %d, denied %d; demand %.1f/s offered, %.1f/s admitted", allowed, denied, pd.Offered, pd.Admitted)
}
