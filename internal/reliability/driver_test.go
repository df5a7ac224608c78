package reliability

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// Phases of a fault run.
const (
	phaseBefore int32 = iota
	phaseFault
	phaseAfter
)

// failureModes maps the fault policies to their failure mode.
var failureModes = map[string]string{"fopen": "open", "fclosed": "closed", "flocal": "local"}

// faultPolicies are one policy per failure mode, 20 tokens refilled at 20
// per second, with the local bucket at half the share.
const faultPolicies = `policies:
  - {name: fopen, capacity: 20, rate: 20/second, failure_mode: open}
  - {name: fclosed, capacity: 20, rate: 20/second, failure_mode: closed}
  - {name: flocal, capacity: 20, rate: 20/second, failure_mode: local, local_scale: 0.5}
`

// driver sends checks of the fault policies from a few workers and judges
// every answer against the policy's failure mode.
type driver struct {
	adm     quotav1.AdmissionClient
	prefix  string
	phase   atomic.Int32
	healed  atomic.Int64 // unix nanos of the switch to phaseAfter
	steady  atomic.Int64 // unix nanos from which every decision must be normal
	started time.Time
	// refuseFrom and refuseUntil (unix nanos) bound a time when the store
	// refuses to grow: a check overlapping it may be denied closed
	// whatever its policy's failure mode. Zero: never.
	refuseFrom, refuseUntil atomic.Int64

	during             counter // decisions that started and ended inside the fault
	normalAdmitDuring  atomic.Int64
	degradedWhenSteady atomic.Int64
	lost               atomic.Int64
	total              atomic.Int64
	lat                latencies
	mu                 sync.Mutex
	bad                []string
	closedAdmitted     map[string]int64 // fclosed admissions per subject
	firstNormalAfter   map[string]time.Time
	subjects           int
}

func newDriver(adm quotav1.AdmissionClient, prefix string) *driver {
	return &driver{adm: adm, prefix: prefix, subjects: 8, closedAdmitted: map[string]int64{}, firstNormalAfter: map[string]time.Time{}}
}

func (d *driver) fail(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.bad) < 20 {
		d.bad = append(d.bad, fmt.Sprintf(format, args...))
	}
}

// run drives workers until ctx ends; it returns when all have stopped.
func (d *driver) run(ctx context.Context, workers int, pause time.Duration) {
	d.started = time.Now()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			names := []string{"fopen", "fclosed", "flocal"}
			for i := w; ctx.Err() == nil; i++ {
				d.one(ctx, names[i%3], fmt.Sprintf("%s-%d", d.prefix, (i/3)%d.subjects))
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		}()
	}
	wg.Wait()
}

func (d *driver) one(ctx context.Context, pol, subject string) {
	p0 := d.phase.Load()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	began := time.Now()
	r, err := d.adm.Check(cctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{pol}, Cost: 1})
	d.lat.add(time.Since(began))
	p1 := d.phase.Load()
	d.total.Add(1)
	if err != nil {
		d.lost.Add(1)
		d.fail("%s %s: no decision: %v", pol, subject, err)
		return
	}
	mode := failureModes[pol]
	if f, u := d.refuseFrom.Load(), d.refuseUntil.Load(); f > 0 && began.UnixNano() < u && time.Now().UnixNano() >= f {
		mode = "closed"
	}
	if r.Degraded != "" {
		switch {
		case r.Degraded != mode:
			d.fail("%s: degraded as %q, its failure mode is %q", pol, r.Degraded, mode)
		case mode == "open" && !r.Allowed:
			d.fail("%s: fail-open denied during a fault", pol)
		case mode == "closed" && (r.Allowed || r.RetryAfter.AsDuration() <= 0):
			d.fail("%s: fail-closed answered allowed=%v retry_after=%v", pol, r.Allowed, r.RetryAfter.AsDuration())
		}
	}
	if p0 == phaseFault && p1 == phaseFault {
		k := "normal"
		if r.Degraded != "" {
			k = r.Degraded
		}
		d.during.add(k, 1)
		if r.Degraded == "" && r.Allowed {
			d.normalAdmitDuring.Add(1)
		}
	}
	if s := d.steady.Load(); s > 0 && began.UnixNano() >= s && r.Degraded != "" {
		d.degradedWhenSteady.Add(1)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if pol == "fclosed" && r.Allowed {
		d.closedAdmitted[subject]++
	}
	if h := d.healed.Load(); h > 0 && began.UnixNano() >= h && r.Degraded == "" {
		if _, ok := d.firstNormalAfter[pol]; !ok {
			d.firstNormalAfter[pol] = time.Now()
		}
	}
}

// recovered reports whether every policy had a normal decision that
// started after the heal.
func (d *driver) recovered() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.firstNormalAfter) == len(failureModes)
}

// recoveredAt is the latest first normal decision after the heal.
func (d *driver) recoveredAt() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	var last time.Time
	for _, at := range d.firstNormalAfter {
		if at.After(last) {
			last = at
		}
	}
	return last
}

func (d *driver) problems() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.bad...)
}

// checkClosedBudget checks that no subject of the fail-closed policy was
// admitted more than C·(1+refills) + r·elapsed, refills counting the times
// Redis lost its data (a restart or a resync refills every bucket). It
// returns the number of subjects checked.
func (d *driver) checkClosedBudget(t *testing.T, capacity, rate float64, refills int) (checked, violations int64) {
	t.Helper()
	elapsed := time.Since(d.started).Seconds()
	bound := capacity*float64(1+refills) + rate*elapsed
	d.mu.Lock()
	defer d.mu.Unlock()
	for s, n := range d.closedAdmitted {
		checked++
		if float64(n) > bound {
			violations++
			t.Errorf("fail-closed subject %s admitted %d > bound %.0f (C=%v, r=%v, %.1fs, %d refills)", s, n, bound, capacity, rate, elapsed, refills)
		}
	}
	return checked, violations
}
