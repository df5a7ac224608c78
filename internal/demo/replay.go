package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/sim"
)

// Arrival is one request of a replayed stream.
type Arrival struct {
	// At is the arrival's offset from the start of the replay.
	At time.Duration
	// Region is the index of the region it arrives in.
	Region int
	// Subject is an index into Replay.Subjects.
	Subject int32
	// Cost is its weight, at least 1.
	Cost int64
}

// ErrReplay is wrapped by every error about a stream Replay cannot play.
var ErrReplay = errors.New("demo: invalid replay")

// Replay plays a fixed arrival stream (a simulator scenario's, say) in real
// time against a Checker, open loop: each request is sent at its arrival
// time whatever the answers were. It records every decision in Recorder at
// the arrival's scheduled offset, so the recorded stream is exactly the
// replayed one; Lateness says how far behind schedule sending fell.
type Replay struct {
	Arrivals []Arrival
	Regions  int
	Subjects []string
	Policy   string
	Checker  Checker
	Recorder *Recorder
	// Start is the wall-clock instant of offset 0; zero means when Run is
	// called.
	Start time.Time
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Workers is the number of concurrent checks per region; default 64.
	// Arrivals beyond what the workers can take are counted as shed.
	Workers int
	// Timeout bounds one check; default 2s.
	Timeout time.Duration

	late     atomic.Int64
	lateMany atomic.Int64
}

// LateThreshold is how late an arrival may be sent before LateCount
// counts it.
const LateThreshold = 50 * time.Millisecond

// Validate reports whether r can be played.
func (r *Replay) Validate() error {
	switch {
	case r.Regions < 1 || r.Regions > sim.MaxScenarioRegions:
		return fmt.Errorf("%w: %d regions, want 1 to %d", ErrReplay, r.Regions, sim.MaxScenarioRegions)
	case len(r.Subjects) == 0 || r.Policy == "":
		return fmt.Errorf("%w: subjects and a policy are required", ErrReplay)
	case len(r.Arrivals) > MaxEvents:
		return fmt.Errorf("%w: %d arrivals, at most %d", ErrReplay, len(r.Arrivals), MaxEvents)
	case r.Checker == nil || r.Recorder == nil:
		return fmt.Errorf("%w: a Checker and a Recorder are required", ErrReplay)
	}
	var last time.Duration
	for i, a := range r.Arrivals {
		switch {
		case a.At < last || a.At > MaxLength:
			return fmt.Errorf("%w: arrival %d at %v is out of order or beyond %v", ErrReplay, i, a.At, MaxLength)
		case a.Region < 0 || a.Region >= r.Regions:
			return fmt.Errorf("%w: arrival %d in region %d of %d", ErrReplay, i, a.Region, r.Regions)
		case a.Subject < 0 || int(a.Subject) >= len(r.Subjects):
			return fmt.Errorf("%w: arrival %d for subject %d of %d", ErrReplay, i, a.Subject, len(r.Subjects))
		case a.Cost < 1:
			return fmt.Errorf("%w: arrival %d costs %d", ErrReplay, i, a.Cost)
		}
		last = a.At
	}
	return nil
}

// Lateness is the largest delay between an arrival's scheduled instant and
// the moment it was handed to a worker.
func (r *Replay) Lateness() time.Duration { return time.Duration(r.late.Load()) }

// LateCount is the number of arrivals sent more than LateThreshold after
// their scheduled instant.
func (r *Replay) LateCount() int64 { return r.lateMany.Load() }

// Run plays the stream and returns when every request was decided, or ctx
// is done. It starts Workers goroutines per region and waits for them.
func (r *Replay) Run(ctx context.Context) error {
	if err := r.Validate(); err != nil {
		return err
	}
	clk := r.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	workers, timeout := r.Workers, r.Timeout
	if workers <= 0 {
		workers = 64
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	start := r.Start
	if start.IsZero() {
		start = clk.Now()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	queues := make([]chan Arrival, r.Regions)
	var wg sync.WaitGroup
	for reg := range queues {
		queues[reg] = make(chan Arrival, 16*workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(q <-chan Arrival) {
				defer wg.Done()
				for a := range q {
					cctx, ccancel := context.WithTimeout(ctx, timeout)
					ok, share, err := r.Checker.Check(cctx, a.Region, r.Policy, r.Subjects[a.Subject], a.Cost)
					ccancel()
					if err != nil {
						if ctx.Err() == nil {
							r.Recorder.Error(a.At, a.Region, a.Cost)
						}
						continue
					}
					r.Recorder.Decision(Event{At: a.At, Region: a.Region, Subject: a.Subject, Cost: a.Cost, Admitted: ok}, share)
				}
			}(queues[reg])
		}
	}
	defer func() {
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for _, a := range r.Arrivals {
		if wait := start.Add(a.At).Sub(clk.Now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return fmt.Errorf("demo: replay stopped at %v: %w", a.At, ctx.Err())
			case <-timer.C:
			}
		} else {
			if late := int64(-wait); late > r.late.Load() {
				r.late.Store(late)
			}
			if -wait > LateThreshold {
				r.lateMany.Add(1)
			}
		}
		select {
		case queues[a.Region] <- a:
		default:
			r.Recorder.Shed(a.Region, 1)
		}
	}
	return ctx.Err()
}
