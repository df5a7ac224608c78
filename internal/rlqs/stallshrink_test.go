package rlqs

import (
	"fmt"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// TestShrinkWhileStreamStalls: the region's share shrinks from 1 to 1/3
// while one Envoy's stream has stopped reading (a paused process whose
// flow-control window is full: renewals of its assignment at the old
// share wait there, and what the node sends after the shrink is dropped).
// The node must not acknowledge the shrink (HeldAbove in the future) while
// that Envoy may still apply an assignment taken above the new share; and
// from the instant it would acknowledge, the refill of the assignments in
// force at the Envoys stays within the new share's. The Envoy resumes 25 s
// after the shrink and applies everything that waited; the node then
// acknowledges within a few intervals.
func TestShrinkWhileStreamStalls(t *testing.T) {
	h := newHarness(t)
	reg, stalled, other, fillers := h.stallPair(t)
	run := &rlqsRun{h: h, id: map[string]string{"tenant": "acme"}}
	const pauseAt, shrinkAt, resumeAt, end = 80, 250, 450, 550 // steps of 100 ms
	const newShare = 1.0 / 3
	newRefill := newShare * rlqsLimits.RefillPerSecond
	var reports uint64
	ackAt := -1
	var ackTime time.Time
	maxAfterAck, maxAt := 0.0, 0
	for s := 0; s < end; s++ {
		up := s < pauseAt || s >= resumeAt
		switch s {
		case pauseAt:
			stalled.Pause()
		case shrinkAt:
			reg.setShare(newShare)
		case resumeAt:
			// The Envoy reads what waited before the clock moves on:
			// delivery within the margin once it runs again.
			stalled.Resume()
			reg.waitDelivered(t, stalled)
		}
		cs := []*Client{stalled, other}
		if !up {
			cs[0] = nil
		}
		if up && s%10 == 0 {
			for _, f := range fillers {
				stalled.Allow(f)
			}
		}
		// The stalled Envoy holds most of the region's rate when it
		// stops reading; after the shrink the other asks for all of it.
		demand := []float64{40, 2}
		if s >= shrinkAt {
			demand[1] = 40
		}
		run.offer(cs, demand)
		now := h.clk.Now()
		if s >= shrinkAt && ackAt < 0 && !reg.srv.HeldAbove("edge.tenant", func(string) float64 { return newShare }).After(now) {
			ackAt, ackTime = s, now
			t.Logf("the node would acknowledge the shrink at step %d (%v after it; the Envoy resumes at step %d)",
				s, time.Duration(s-shrinkAt)*runStep, resumeAt)
		}
		if ackAt >= 0 {
			if r := refillInForce(now, []*Client{stalled, other}, run.id); r > maxAfterAck {
				maxAfterAck, maxAt = r, s
			}
		}
		if s%10 != 9 {
			continue
		}
		reg.reportAndStep(t, cs, &reports, other)
	}
	t.Logf("dropped responses %v; after the acknowledgement the Envoys' assignments refill at most %.1f tokens/s (step %d), the new share's refill %.1f",
		value(reg.srv.m.dropped), maxAfterAck, maxAt, newRefill)
	if value(reg.srv.m.dropped) == 0 {
		t.Fatal("no response dropped: the stream did not stall with a full window")
	}
	switch {
	case ackAt < 0:
		t.Errorf("the node never acknowledged the shrink, %v after the Envoy resumed", time.Duration(end-resumeAt)*runStep)
	case ackAt < resumeAt:
		t.Errorf("the node acknowledged the shrink at step %d, while the stalled stream (resuming at step %d) could still apply an assignment above the new share", ackAt, resumeAt)
	}
	if maxAfterAck > newRefill {
		t.Errorf("after the acknowledgement (step %d) the Envoys' assignments refill %.1f tokens/s at step %d, over the new share's %.1f", ackAt, maxAfterAck, maxAt, newRefill)
	}
	rep := run.check(t)
	recordRLQS(t, "rlqs: share shrunk while a stream stalls", rep,
		fmt.Sprintf("share 1 → 1/3 20 s before a stalled stream (37 s) reads again; acknowledged at step %d (resumed at %d), at most %.1f tokens/s in force after, the new share's %.1f",
			ackAt, resumeAt, maxAfterAck, newRefill))
	// From the acknowledgement on, the region admits within its new
	// share alone: C/3 + r/3·W.
	after := &rlqsRun{h: h, limits: bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: rlqsLimits.Capacity / 3,
		RefillPerSecond: newRefill}}
	for _, a := range run.adms {
		if !a.At.Before(ackTime) {
			after.adms = append(after.adms, a)
		}
	}
	for _, o := range run.offers {
		if !o.Before(ackTime) {
			after.offers = append(after.offers, o)
		}
	}
	if ackAt >= 0 {
		after.check(t)
	}
}
