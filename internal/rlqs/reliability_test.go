package rlqs

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/reliability"
)

// proxied is an Envoy whose stream to its node passes through a fault
// proxy, so that a test can hold or cut what the node sends it.
type proxied struct {
	c     *Client
	proxy *faultproxy.Proxy
	conn  *grpc.ClientConn
	up    bool
}

func (h *harness) proxied(r *region, ccfg ClientConfig) *proxied {
	t := h.t
	p, err := faultproxy.Start(faultproxy.Config{Target: r.conn.Target()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(p.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ccfg.Clock = h.clk
	e := &proxied{c: NewClient(ccfg), proxy: p, conn: conn}
	e.connect(t)
	t.Cleanup(func() {
		e.c.Close()
		_ = conn.Close()
		_ = p.Close()
	})
	return e
}

func (e *proxied) connect(t *testing.T) {
	t.Helper()
	if err := e.proxy.SetMode(faultproxy.Pass); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Connect(context.Background(), e.conn); err != nil {
		t.Fatal(err)
	}
	e.up = true
}

// rlqsRun drives Envoys on a manual clock in steps of 100 ms, offering
// each its demand and recording admissions of one tenant.
type rlqsRun struct {
	h      *harness
	id     map[string]string
	acc    []float64
	adms   []boundcheck.Admission
	offers []time.Time
	limits bucket.Limits // the policy's; rlqsLimits when zero
}

const runStep = 100 * time.Millisecond

// offer advances the clock one step and offers each Envoy its demand
// (requests per second); a nil Envoy is skipped.
func (r *rlqsRun) offer(cs []*Client, demand []float64) {
	now := r.h.clk.Advance(runStep)
	if r.acc == nil {
		r.acc = make([]float64, len(cs))
	}
	for i, c := range cs {
		if c == nil {
			continue
		}
		r.acc[i] += demand[i] * runStep.Seconds()
		for ; r.acc[i] >= 1; r.acc[i]-- {
			r.offers = append(r.offers, now)
			if c.Allow(r.id) {
				r.adms = append(r.adms, boundcheck.Admission{Policy: "p", Subject: "acme", Region: "r", At: now, Cost: 1})
			}
		}
	}
}

// check runs the bound checker over the admissions and returns its report.
func (r *rlqsRun) check(t *testing.T) boundcheck.Report {
	t.Helper()
	l := r.limits
	if l == (bucket.Limits{}) {
		l = rlqsLimits
	}
	rep, err := boundcheck.Check(boundcheck.Config{Limits: map[string]bucket.Limits{"p": l},
		Windows: []time.Duration{runStep, time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second, 10 * time.Second}}, r.adms)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("over the bound: %v", v)
	}
	ideal := boundcheck.IdealAdmitted(r.offers, l)
	t.Logf("admitted %d of %d offered, an ideal bucket %d (under-admission %.1f%%); %d windows, peak %.2f of the bound",
		len(r.adms), len(r.offers), ideal, 100*(1-float64(len(r.adms))/float64(ideal)), rep.Windows, rep.Peak)
	return rep
}

// stallPair is a region at share 1 with two Envoys: the first on a
// connection with a 64 KiB flow-control window and 127 filler buckets
// (their names 90 bytes), so that the node's responses fill that window
// within a few rounds once the Envoy stops reading; the second on the
// region's connection.
func (h *harness) stallPair(t *testing.T) (reg *region, stalling, other *Client, fillers []map[string]string) {
	t.Helper()
	ccfg := ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}
	reg = h.region("r", 1, 0, ccfg, nil)
	conn, err := grpc.NewClient(reg.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	ccfg.Clock = h.clk
	stalling, other = NewClient(ccfg), NewClient(ccfg)
	if err := stalling.Connect(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	if err := other.Connect(context.Background(), reg.conn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stalling.Close()
		other.Close()
		_ = conn.Close()
	})
	fillers = make([]map[string]string, 127)
	for i := range fillers {
		fillers[i] = map[string]string{"tenant": fmt.Sprintf("filler-%s-%02d", strings.Repeat("x", 80), i)}
	}
	return reg, stalling, other, fillers
}

// reportAndStep is one report interval of the Envoys cs (nil: paused):
// each reports, the node runs a round once it has every report, and the
// round's responses reach reader (an Envoy that reads).
func (r *region) reportAndStep(t *testing.T, cs []*Client, reports *uint64, reader *Client) {
	t.Helper()
	for _, c := range cs {
		if c == nil {
			continue
		}
		c.mu.Lock()
		*reports += uint64(len(c.buckets))
		c.mu.Unlock()
		if err := c.Report(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "reports", func() bool { return r.srv.Reports() >= *reports })
	before := reader.Responses()
	r.srv.Step(context.Background())
	waitFor(t, "responses", func() bool { return reader.Responses() > before })
}

// waitDelivered waits until the node has handed every queued response to
// the transport and c has applied no more for 100 ms: what waited in c's
// stream has arrived.
func (r *region) waitDelivered(t *testing.T, c *Client) {
	t.Helper()
	last, since := c.Responses(), time.Now()
	waitFor(t, "delivery of what waited", func() bool {
		r.srv.mu.Lock()
		queued := 0
		for _, ss := range r.srv.streams {
			queued += len(ss.out)
		}
		r.srv.mu.Unlock()
		if n := c.Responses(); n != last || queued > 0 {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 100*time.Millisecond
	})
}

// rlqsLimits are edgePolicies' tenant limits.
var rlqsLimits = bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 60, RefillPerSecond: 30}

// TestStreamCutMidAssignment: two Envoys of one region behind fault
// proxies take turns: one reports a low demand, so the round shrinks its
// assignment and grows the other's, and its stream is cut while the
// changed assignment is on the way (held in the proxy, then dropped). The
// cut Envoy never learns of the shrink: it keeps its old, larger
// assignment until that one's TTL and spends all of it, while the other
// spends its grown one; it reconnects 2.6 s later. No window over C + r·W,
// and the refill of the assignments in force at the Envoys never sums
// past the region's (the invariant the leases keep, checked at every
// step).
func TestStreamCutMidAssignment(t *testing.T) {
	rep := streamCut(t, rlqsLimits, func(at int) (v, o float64) {
		// The victim holds most of the rate, then reports a quiet second
		// while the other's demand jumps: the round at 149 shrinks the
		// victim's assignment and grows the other's, and that shrink is
		// lost with the victim's stream. The victim then spends its old
		// assignment in full until its TTL.
		switch {
		case at >= 140 && at < 150:
			return 0, 60
		case at >= 150:
			return 60, 60
		}
		return 30, 2
	})
	recordRLQS(t, "rlqs: stream cut mid-assignment", rep, "4 shrinking assignments lost with their stream; the cut Envoy spends its old, larger one to its TTL")
}

// streamCut runs four cycles of 18 s: in each, one Envoy (the victim,
// alternating) and the other offer the demands pattern(step in cycle)
// gives, and the victim's stream is cut at the round of step 149 while
// that round's assignment is on the way to it; it reconnects at step 175.
// The refill of the assignments in force at the Envoys must never sum
// past the region's; it returns the bound checker's report.
func streamCut(t *testing.T, limits bucket.Limits, pattern func(at int) (victim, other float64)) boundcheck.Report {
	t.Helper()
	h := newHarness(t)
	if limits != rlqsLimits {
		set, err := policy.Parse("edge.yaml", []byte(fmt.Sprintf(`domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: %v, burst: %d}
`, limits.RefillPerSecond, limits.Capacity)))
		if err != nil {
			t.Fatal(err)
		}
		h.set.Store(set)
	}
	ccfg := ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}
	reg := h.region("r", 1, 0, ccfg, nil)
	es := []*proxied{h.proxied(reg, ccfg), h.proxied(reg, ccfg)}
	run := &rlqsRun{h: h, id: map[string]string{"tenant": "acme"}, limits: limits}
	var reports uint64
	cuts := 0
	maxRate, maxAt := 0.0, 0
	for s := 0; s < 720; s++ {
		cycle, at := s/180, s%180
		victim, other := es[cycle%2], es[1-cycle%2]
		v, o := pattern(at)
		demand := make([]float64, 2)
		demand[cycle%2], demand[1-cycle%2] = v, o
		if at == 175 && !victim.up {
			victim.connect(t)
		}
		cs := []*Client{es[0].c, es[1].c}
		run.offer(cs, demand)
		if r := refillInForce(h.clk.Now(), cs, run.id); r > maxRate {
			maxRate, maxAt = r, s
		}
		if s%10 != 9 {
			continue
		}
		reportUp(t, reg, es, &reports)
		cut := at == 149 && victim.up
		if cut {
			// The round's changed assignment goes into the proxy and
			// stays there; then the connection is dropped.
			if err := victim.proxy.SetMode(faultproxy.Blackhole); err != nil {
				t.Fatal(err)
			}
		}
		before, vbefore := other.c.Responses(), victim.c.Responses()
		reg.srv.Step(context.Background())
		if other.up {
			waitFor(t, "responses", func() bool { return other.c.Responses() > before })
		}
		if victim.up && !cut {
			waitFor(t, "responses", func() bool { return victim.c.Responses() > vbefore })
		}
		if cut {
			held := victim.c.Responses()
			if err := victim.proxy.SetMode(faultproxy.Drop); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the cut", func() bool { victim.c.mu.Lock(); defer victim.c.mu.Unlock(); return victim.c.st == nil })
			if victim.c.Responses() != held {
				t.Fatal("the held assignment reached the Envoy")
			}
			victim.up = false
			cuts++
		}
	}
	if cuts != 4 {
		t.Fatalf("%d cuts, want 4", cuts)
	}
	t.Logf("largest refill in force at the Envoys: %.1f tokens/s at step %d (the region's refill: %v)", maxRate, maxAt, limits.RefillPerSecond)
	if maxRate > limits.RefillPerSecond {
		t.Errorf("the Envoys' assignments in force refill %.1f tokens/s at step %d, over the region's %v", maxRate, maxAt, limits.RefillPerSecond)
	}
	return run.check(t)
}

// TestStreamCutFundedGrowth: as TestStreamCutMidAssignment, but the
// region's bucket has tokens for every fresh burst (capacity 600 at 30
// tokens per second): the victim takes most of the rate, goes quiet (its
// shrink is lost with its stream) and the other's demand jumps after the
// cut, so its grown assignment is granted as soon as the lease stops
// counting the victim's old one. The victim's
// old assignment stays in force to its TTL, so the lease must count it
// until then: the refill of the assignments in force never sums past the
// region's, and no window goes over C + r·W.
func TestStreamCutFundedGrowth(t *testing.T) {
	rep := streamCut(t, bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 600, RefillPerSecond: 30}, func(at int) (v, o float64) {
		switch {
		case at < 130:
			return 60, 2
		case at < 150:
			return 0, 2
		}
		return 60, 60
	})
	recordRLQS(t, "rlqs: stream cut, grown assignment funded", rep, "4 shrinks lost with their stream while the bucket funds the other Envoy's growth")
}

// reportUp has every Envoy that is up report its usage (its report
// timer firing), waits until the node has handled every report, and
// returns those Envoys; reports counts the usage entries sent so far.
func reportUp(t *testing.T, reg *region, es []*proxied, reports *uint64) []*proxied {
	t.Helper()
	var up []*proxied
	for _, e := range es {
		if !e.up {
			continue
		}
		e.c.mu.Lock()
		n := len(e.c.buckets)
		e.c.mu.Unlock()
		if err := e.c.Report(); err != nil {
			t.Fatal(err)
		}
		*reports += uint64(n)
		up = append(up, e)
	}
	waitFor(t, "reports", func() bool { return reg.srv.Reports() >= *reports })
	return up
}

// refillInForce sums the refill rates of the token-bucket assignments in
// force at now for bucket id across cs: what the Envoys may admit per
// second from then on, which the leases must keep within the region's
// refill.
func refillInForce(now time.Time, cs []*Client, id map[string]string) float64 {
	var sum float64
	for _, c := range cs {
		c.mu.Lock()
		if b := c.buckets[idKey(id)]; b != nil && b.has && (b.expires.IsZero() || now.Before(b.expires)) && b.strategy.GetTokenBucket() != nil {
			sum += b.rate
		}
		c.mu.Unlock()
	}
	return sum
}

// recordRLQS appends a bound row to the reliability report when
// RELIABILITY_REPORT names one (make reliability).
func recordRLQS(t *testing.T, name string, rep boundcheck.Report, note string) {
	t.Helper()
	if err := reliability.NewRecorder(os.Getenv("RELIABILITY_REPORT")).Record(reliability.Entry{
		Kind: reliability.KindBound, Name: name, Injected: true, Survived: !t.Failed() && len(rep.Violations) == 0,
		BoundDecisions: int64(rep.Decisions), BoundWindows: rep.Windows, Violations: int64(len(rep.Violations)), Note: note,
	}); err != nil {
		t.Error(err)
	}
}

// TestLeaseHolderPausedPastTTL: three Envoys of one region behind fault
// proxies; one at a time is paused (it decides nothing, reports nothing
// and reads nothing: what the node sends waits in the proxy) for 5 s, past
// its assignment's 3 s TTL, and once for 35 s, past the node's IdleAfter
// (the node keeps the bucket and renews its lease: the stream stalls). On resuming it
// applies everything that waited, in order, and spends whatever that
// leaves it, at full demand. No window over C + r·W.
func TestLeaseHolderPausedPastTTL(t *testing.T) {
	h := newHarness(t)
	ccfg := ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}
	reg := h.region("r", 1, 0, ccfg, nil)
	es := []*proxied{h.proxied(reg, ccfg), h.proxied(reg, ccfg), h.proxied(reg, ccfg)}
	run := &rlqsRun{h: h, id: map[string]string{"tenant": "acme"}}
	demand := []float64{40, 40, 40}
	var reports uint64
	paused, pauses := -1, 0
	var resumeAt int
	for s := 0; s < 1200; s++ {
		switch {
		case paused < 0 && s%100 == 45:
			paused = (s / 100) % 3
			resumeAt = s + 50
			if s == 545 {
				resumeAt = s + 350 // past IdleAfter
			}
			if err := es[paused].proxy.SetMode(faultproxy.Blackhole); err != nil {
				t.Fatal(err)
			}
			es[paused].up = false
			pauses++
		case paused >= 0 && s == resumeAt:
			e := es[paused]
			before := e.c.Responses()
			if err := e.proxy.SetMode(faultproxy.Pass); err != nil {
				t.Fatal(err)
			}
			// Everything the node sent during the pause arrives now.
			waitFor(t, "held responses", func() bool { return e.c.Responses() > before })
			time.Sleep(20 * time.Millisecond)
			e.up, paused = true, -1
		}
		cs := make([]*Client, len(es))
		for i, e := range es {
			if e.up {
				cs[i] = e.c
			}
		}
		run.offer(cs, demand)
		if s%10 != 9 {
			continue
		}
		waits := reportUp(t, reg, es, &reports)
		before := make([]uint64, len(waits))
		for i, e := range waits {
			before[i] = e.c.Responses()
		}
		reg.srv.Step(context.Background())
		for i, e := range waits {
			waitFor(t, "responses", func() bool { return e.c.Responses() > before[i] })
		}
	}
	rep := run.check(t)
	var abandons uint64
	for _, e := range es {
		abandons += e.c.Stats().Abandons
	}
	t.Logf("%d pauses, %d abandons applied", pauses, abandons)
	if pauses < 8 {
		t.Fatalf("%d pauses: the run did not pause past IdleAfter", pauses)
	}
	if abandons != 0 {
		// A paused Envoy reports nothing, so its stream stalls: the node
		// keeps its buckets and leases rather than abandon them while
		// older assignments may still wait in the stream.
		t.Fatalf("%d abandons: the node abandoned a paused Envoy's bucket", abandons)
	}
	recordRLQS(t, "rlqs: lease holder paused past its TTL", rep, "Envoys paused 5 s (TTL 3 s) and 35 s (past IdleAfter) with the node's responses held, applied on resuming")
}

// TestPausePastFlowControl: an Envoy with 128 buckets stops reading (a
// stopped process) for 40 s. The node's responses fill the stream's
// flow-control window (64 KiB, no dynamic window) and its queue, so the
// node drops the later ones, among them the abandon of the paused
// Envoy's idle buckets. Another Envoy on the watched tenant wants the
// whole rate meanwhile. On resuming, the paused Envoy applies the
// assignments that waited in the window (each with its TTL counted from
// then) and spends them at full demand: the refill of the assignments in
// force must never sum past the region's, and no window go over C + r·W.
func TestPausePastFlowControl(t *testing.T) {
	h := newHarness(t)
	reg, paused, other, fillers := h.stallPair(t)
	run := &rlqsRun{h: h, id: map[string]string{"tenant": "acme"}}
	const pauseAt, resumeAt = 100, 500 // steps of 100 ms
	var reports uint64
	maxRate, maxAt := 0.0, 0
	for s := 0; s < 650; s++ {
		up := s < pauseAt || s >= resumeAt
		switch s {
		case pauseAt:
			paused.Pause()
		case resumeAt:
			before := paused.Responses()
			paused.Resume()
			waitFor(t, "held responses", func() bool { return paused.Responses() > before })
			time.Sleep(50 * time.Millisecond)
		}
		cs, demand := []*Client{paused, other}, []float64{20, 20}
		if !up {
			cs[0] = nil
		}
		if s >= pauseAt {
			demand = []float64{60, 60}
		}
		if up && s%10 == 0 {
			for _, f := range fillers {
				paused.Allow(f)
			}
		}
		run.offer(cs, demand)
		if r := refillInForce(h.clk.Now(), []*Client{paused, other}, run.id); r > maxRate {
			maxRate, maxAt = r, s
		}
		if s%10 != 9 {
			continue
		}
		reg.reportAndStep(t, cs, &reports, other)
	}
	dropped := value(reg.srv.m.dropped)
	t.Logf("largest refill in force at the Envoys: %.1f tokens/s at step %d; %v responses dropped; paused Envoy: %+v", maxRate, maxAt, dropped, paused.Stats())
	if dropped == 0 {
		t.Fatal("no response dropped: the pause did not fill the flow-control window")
	}
	if maxRate > rlqsLimits.RefillPerSecond {
		t.Errorf("the Envoys' assignments in force refill %.1f tokens/s at step %d, over the region's %v", maxRate, maxAt, rlqsLimits.RefillPerSecond)
	}
	rep := run.check(t)
	recordRLQS(t, "rlqs: paused past the flow-control window", rep, "an Envoy with 128 buckets paused 40 s: responses and the abandon dropped, the window's assignments applied on resuming")
}
