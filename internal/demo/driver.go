package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quotacoord/quota/internal/clock"
)

// Checker sends one admission check to a region's node.
type Checker interface {
	// Check asks region's node whether subject may spend cost under
	// policy. A denial is admitted == false with a nil error; share is the
	// share of the global budget the node enforced (0 when unknown).
	Check(ctx context.Context, region int, policy, subject string, cost int64) (admitted bool, share float64, err error)
}

// Driver plays a Story open-loop: arrivals follow the phase rates whatever
// the answers, as real clients would.
type Driver struct {
	Story    Story
	Checker  Checker
	Recorder *Recorder
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Tick is the arrival granularity; default 10ms.
	Tick time.Duration
	// Workers is the number of concurrent checks per region; default 32.
	// Arrivals beyond what the workers can take are counted as shed.
	Workers int
	// Timeout bounds one check; default 2s.
	Timeout time.Duration
	// OnPhase, when set, is called (from the driver's goroutine) as each
	// phase starts, before its first arrival.
	OnPhase func(i int, p Phase)
}

// Run plays the story and returns when it is over or ctx is done. It
// starts one arrival goroutine and Workers check goroutines per region and
// waits for all of them before returning.
func (d *Driver) Run(ctx context.Context) error {
	if err := d.Story.Validate(); err != nil {
		return err
	}
	if d.Checker == nil || d.Recorder == nil {
		return errors.New("demo: driver needs a Checker and a Recorder")
	}
	clk := d.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	tick, workers, timeout := d.Tick, d.Workers, d.Timeout
	if tick <= 0 {
		tick = 10 * time.Millisecond
	}
	if workers <= 0 {
		workers = 32
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := len(d.Story.Regions)
	queues := make([]chan time.Duration, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		queues[r] = make(chan time.Duration, 4*workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(region int, q <-chan time.Duration) {
				defer wg.Done()
				for at := range q {
					cctx, ccancel := context.WithTimeout(ctx, timeout)
					ok, share, err := d.Checker.Check(cctx, region, d.Story.Policy, d.Story.Subject, 1)
					ccancel()
					if err != nil {
						if ctx.Err() != nil {
							continue
						}
						d.Recorder.Error(at, region, 1)
						continue
					}
					d.Recorder.Decision(Event{At: at, Region: region, Cost: 1, Admitted: ok}, share)
				}
			}(r, queues[r])
		}
	}
	defer func() {
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()

	start := clk.Now()
	length := d.Story.Length()
	acc := make([]float64, n)
	last := time.Duration(0)
	phase := -1
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		now := clk.Now().Sub(start)
		if now >= length {
			return nil
		}
		i, p := d.Story.At(now)
		if i != phase {
			phase = i
			if d.OnPhase != nil {
				d.OnPhase(i, p)
			}
		}
		dt := (now - last).Seconds()
		last = now
		for r := 0; r < n; r++ {
			acc[r] += p.Rates[r] * dt
			k := int64(acc[r])
			acc[r] -= float64(k)
			for j := int64(0); j < k; j++ {
				select {
				case queues[r] <- now:
				default:
					d.Recorder.Shed(r, k-j)
					j = k
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: story stopped at %v: %w", now.Round(time.Millisecond), ctx.Err())
		case <-t.C:
		}
	}
}
