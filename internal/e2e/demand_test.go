package e2e

import (
	"testing"
	"time"
)

// TestDemandMovesTheShare is must-show 1 (and, through the replay at its
// end, part of must-show 2): demand only in region a moves the hot
// subject's share to a within 5 rebalance intervals and a then admits at
// least 90% of the global rate; then demand moves to b and b catches up
// the same way.
func TestDemandMovesTheShare(t *testing.T) {
	e := newEnv(t, 1, "a", "b", "c")
	a, b := e.regions[0], e.regions[1]
	followDemand(t, e, nil, a)
	followDemand(t, e, a, b)
	for _, r := range e.regions {
		s := r.load.snapshot()
		t.Logf("region %s: %d admitted, %d denied, %d degraded, %d failed checks", r.name, s.allowed, s.denied, s.degraded, s.failed)
	}
	rep := e.replay()
	if rep.Epochs < 4 || rep.Acks < 4 {
		t.Fatalf("replay saw %d epochs and %d acks; the demand moves should have published more", rep.Epochs, rep.Acks)
	}
}

// followDemand stops the load in from (when not nil), offers 3× the global
// rate in to, and checks that to's share passes 0.8 within 5 rebalance
// intervals and that, once the share settled, to admits at least 90% of
// the global rate.
func followDemand(t *testing.T, e *env, from, to *region) {
	t.Helper()
	const (
		within  = 5 * rebalanceIv
		window  = 6 * time.Second
		settled = 2 * rebalanceIv
	)
	if from != nil {
		from.load.setRate(0)
	}
	start := time.Now()
	to.load.setRate(offeredRate)
	above := func(s float64) bool { return s > 0.8 }
	e.waitFor(4*within, "share above 0.8 in region "+to.name, func() bool { return above(to.load.share()) })
	at, _ := to.load.firstShareAfter(start, above)
	took := at.Sub(start)
	t.Logf("demand in %s: its checks ran at share > 0.8 after %v (%.1f rebalance intervals)", to.name, took.Round(time.Millisecond), took.Seconds()/rebalanceIv.Seconds())
	for _, a := range e.allocHistory(policyName) {
		if a.PublishedAt.After(start) {
			t.Logf("  epoch %d %s at +%v: %s %.3f, %s %.3f (%s)", a.Epoch, a.Phase, a.PublishedAt.Sub(start).Round(time.Millisecond),
				to.name, share(a, to.name), "others", 1-share(a, to.name), a.Reason)
		}
	}
	if took > within {
		t.Errorf("region %s reached share 0.8 after %v, want within 5 rebalance intervals (%v)", to.name, took, within)
	}

	// Let the share settle (no change for two intervals), then measure.
	last, since := to.load.share(), time.Now()
	e.waitFor(20*rebalanceIv, "settled share in "+to.name, func() bool {
		if s := to.load.share(); s != last {
			last, since = s, time.Now()
		}
		return time.Since(since) >= settled
	})
	a, _ := e.alloc()
	before := to.load.snapshot()
	time.Sleep(window)
	after := to.load.snapshot()
	secs := after.at.Sub(before.at).Seconds()
	admitted := float64(after.allowed-before.allowed) / secs
	offered := float64(after.allowed+after.denied+after.degraded+after.failed-before.allowed-before.denied-before.degraded-before.failed) / secs
	frac := admitted / globalRate
	t.Logf("region %s settled at share %.3f (epoch %d, published share %.3f): offered %.1f/s, admitted %.2f/s over %.1fs = %.1f%% of the global rate %.0f/s",
		to.name, to.load.share(), a.Epoch, share(a, to.name), offered, admitted, secs, 100*frac, globalRate)
	if frac < 0.9 {
		t.Errorf("region %s admitted %.1f%% of the global rate, want at least 90%%", to.name, 100*frac)
	}
	if n := after.degraded - before.degraded + after.failed - before.failed; n > 0 {
		t.Logf("region %s: %d checks degraded or failed in the window", to.name, n)
	}
}
