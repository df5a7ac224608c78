package rlqs

import (
	"context"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
)

// TestNodeKilledWithLeasesOut: two nodes of one region share its bucket,
// each serving two Envoys, and split the region's rate without seeing
// each other (the lease script keeps their sum within it). Node a is
// killed without a drain while its leases are out: its Envoys keep their
// assignments until the TTL, reconnect to node b two seconds later and
// subscribe again under new holders, whose leases get only what a's
// lapsing ones leave. No window goes over C + r·W.
func TestNodeKilledWithLeasesOut(t *testing.T) {
	h := newHarness(t)
	ccfg := ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}
	a := h.region("a", 1, 2, ccfg, nil)
	b := h.region("b", 1, 2, ccfg, func(c *Config) { c.Store = a.store })
	clients := append(append([]*Client{}, a.clients...), b.clients...)
	id := map[string]string{"tenant": "acme"}
	limits := bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 60, RefillPerSecond: 30}
	const step = 100 * time.Millisecond
	var adms []boundcheck.Admission
	var offers []time.Time
	acc := make([]float64, len(clients))
	for s := 0; s < 400; s++ {
		switch s {
		case 200: // a dies with its leases out
			a.kill()
			a.clients = nil
		case 220: // its Envoys find b
			for _, c := range clients[:2] {
				if err := c.Connect(context.Background(), b.conn); err != nil {
					t.Fatal(err)
				}
			}
			b.clients = clients
		}
		now := h.clk.Advance(step)
		for i, c := range clients {
			acc[i] += 90.0 / 4 * step.Seconds() // 3× the refill in all
			for ; acc[i] >= 1; acc[i]-- {
				offers = append(offers, now)
				if c.Allow(id) {
					adms = append(adms, boundcheck.Admission{Policy: "p", Subject: "acme", Region: "r", At: now, Cost: 1})
				}
			}
		}
		if s%10 == 9 {
			if a.clients != nil {
				a.round(t)
			}
			b.round(t)
		}
	}
	rep, err := boundcheck.Check(boundcheck.Config{Limits: map[string]bucket.Limits{"p": limits},
		Windows: []time.Duration{step, time.Second, 3 * time.Second, 10 * time.Second}}, adms)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("over the bound: %v", v)
	}
	ideal := boundcheck.IdealAdmitted(offers, limits)
	t.Logf("admitted %d, an ideal bucket %d (under-admission %.1f%%)", len(adms), ideal, 100*(1-float64(len(adms))/float64(ideal)))
	if len(adms) < ideal/2 {
		t.Errorf("admitted %d, under half the ideal %d", len(adms), ideal)
	}
	recordRLQS(t, "rlqs: node killed with leases out", rep, "two nodes lease one region's bucket; one killed without a drain, its Envoys move to the other")
}
