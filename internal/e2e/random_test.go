package e2e

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
)

// TestRandomDemandRestartsAndFailover is must-show 2 beyond the demand
// test: seeded random demand in three regions, random region restarts
// (graceful, which revokes the lease, and crash-like, which leaves it to
// expire), random Redis flushes (the nodes run with the loss guard), and,
// halfway, the leading coordinator killed while a shrink is pending (a
// region cut off from etcd cannot acknowledge it) and replaced by the
// standby, with a fresh standby started. Every admitted decision is then
// checked against the bound (boundcheck), and etcd's whole history
// replayed: at no revision do the shares the regions may be enforcing sum
// above 1 + ε.
func TestRandomDemandRestartsAndFailover(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("E2E_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (E2E_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 13))
	e := newEnv(t, 2, "a", "b", "c")
	rates := []float64{0, 5, 15, 30}
	const (
		steps   = 10
		stepDur = 1500 * time.Millisecond
	)
	var restarts, crashes, flushes int
	for step := range steps {
		for _, r := range e.regions {
			r.load.setRate(rates[rng.IntN(len(rates))])
		}
		switch {
		case step == steps/2:
			killLeaderMidShrink(t, e, rng)
		case rng.Float64() < 0.15:
			// Redis loses its state: every bucket of the region is gone.
			r := e.regions[rng.IntN(len(e.regions))]
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := r.redis.Client(t).FlushAll(ctx).Err()
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			flushes++
			t.Logf("step %d: region %s's Redis flushed", step, r.name)
		case rng.Float64() < 0.4:
			r := e.regions[rng.IntN(len(e.regions))]
			graceful := rng.IntN(2) == 0
			// Both kinds happen in every run.
			if crashes == 0 && restarts > 0 {
				graceful = false
			} else if restarts == 0 && crashes > 0 {
				graceful = true
			}
			if graceful {
				r.stop()
				restarts++
				t.Logf("step %d: region %s restarted gracefully", step, r.name)
			} else {
				r.crash()
				crashes++
				t.Logf("step %d: region %s crashed and restarted", step, r.name)
			}
			r.start()
		}
		time.Sleep(stepDur)
	}
	for _, r := range e.regions {
		r.load.setRate(0)
		s := r.load.snapshot()
		t.Logf("region %s: %d starts; %d admitted, %d denied, %d degraded, %d failed checks",
			r.name, r.starts, s.allowed, s.denied, s.degraded, s.failed)
	}
	t.Logf("%d graceful restarts, %d crashes, %d Redis flushes, 1 coordinator killed mid-shrink", restarts, crashes, flushes)
	e.checkBound()
	rep := e.replay()
	if rep.Epochs < 6 || rep.Acks < 10 || rep.Revisions < 20 {
		t.Fatalf("replay saw only %d revisions, %d epochs, %d acks", rep.Revisions, rep.Epochs, rep.Acks)
	}
}

// killLeaderMidShrink moves the demand so the allocation must shrink,
// cuts one region off etcd so it cannot acknowledge the shrink, kills the
// leader while the shrink is pending, and checks that the standby takes
// over and completes it (after the cut-off region's lease expired plus
// the skew margin). A fresh standby replaces the killed coordinator.
func killLeaderMidShrink(t *testing.T, e *env, rng *rand.Rand) {
	t.Helper()
	old := e.leader(10 * time.Second)
	before, _ := e.alloc()
	// Demand leaves the region with the largest share for another one.
	top := e.regions[0]
	for _, r := range e.regions {
		if share(before, r.name) > share(before, top.name) {
			top = r
		}
	}
	next := e.regions[(indexOf(e.regions, top)+1+rng.IntN(len(e.regions)-1))%len(e.regions)]
	for _, r := range e.regions {
		r.load.setRate(0)
	}
	next.load.setRate(offeredRate)
	mute := e.regions[rng.IntN(len(e.regions))]
	if err := mute.proxy.SetMode(faultproxy.Blackhole); err != nil {
		t.Fatal(err)
	}
	var shrink etcdlayout.Allocation
	e.waitFor(8*rebalanceIv, "a pending shrink", func() bool {
		a, ok := e.alloc()
		if ok && a.Epoch > before.Epoch && a.Phase == etcdlayout.PhaseShrink {
			shrink = a
			return true
		}
		return false
	})
	killed := time.Now()
	old.kill(t)
	t.Logf("demand moved %s -> %s, %s cut off; leader %s killed at epoch %d (shrink pending)",
		top.name, next.name, mute.name, old.name, shrink.Epoch)
	nl := e.leader(5*sessionTTL + 5*time.Second)
	t.Logf("%s leads %v after the kill", nl.name, time.Since(killed).Round(time.Millisecond))
	e.coords = append(e.coords, e.startCoord("coord-"+strconv.Itoa(len(e.coords)), e.tokenFile))
	e.waitFor(regionTTL+skewMargin+10*rebalanceIv, "the pending shrink completed by the new leader", func() bool {
		a, ok := e.alloc()
		return ok && a.Epoch > shrink.Epoch
	})
	grown, _ := e.alloc()
	t.Logf("new leader published epoch %d (%s) %v after the kill", grown.Epoch, grown.Phase, grown.PublishedAt.Sub(killed).Round(time.Millisecond))
	if err := mute.proxy.SetMode(faultproxy.Pass); err != nil {
		t.Fatal(err)
	}
	mute.waitReady(15 * time.Second)
}

func indexOf(rs []*region, r *region) int {
	for i, x := range rs {
		if x == r {
			return i
		}
	}
	return -1
}
