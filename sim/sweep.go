package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
)

// Sweep runs every Config and returns their Results in order, each equal
// to what Run returns for it (byte for byte once encoded).
//
// It decides the baselines once per request stream: Configs whose stream
// is the same (same scenario after overrides, seed, overcommit and series
// bins) share one baseline pass, as the default sweep's rebalance
// intervals and protocols all do. The subjects of a retrying group are the
// exception: their stream holds the system's denials, so each run decides
// their baselines and merges them with the shared ones. The pass also
// records the stream (up to maxRecordedBatches batches), which the runs
// replay instead of drawing it again.
//
// Runs are independent and deterministic, so Sweep spreads them over
// GOMAXPROCS goroutines (each run stays single-threaded; GOMAXPROCS=1
// runs everything in order in one goroutine). It runs one stream's runs at
// a time, with the next stream's pass beside them, so at most two
// recordings are held. progress, when not nil, is called in the caller's
// goroutine after each run with the runs done and the total. Sweep stops
// early when ctx is done and returns its error; every goroutine it started
// has returned when it returns.
func Sweep(ctx context.Context, cfgs []Config, progress func(done, total int)) ([]*Result, error) {
	keys := make([]string, len(cfgs))
	users := map[string]int{}
	cfgs = append([]Config(nil), cfgs...)
	for i := range cfgs {
		c, err := cfgs[i].withDefaults()
		if err != nil {
			return nil, fmt.Errorf("sim: sweep run %d: %w", i, err)
		}
		cfgs[i] = c
		if k, ok := streamKey(c); ok {
			keys[i] = k
			users[k]++
		}
	}
	// One group per stream that two or more runs share (it gets a pass),
	// in order of first appearance, then one of every other run.
	type group struct {
		runs  []int
		pass  bool
		base  *baseRun
		rec   *recording
		ready bool // pass done
	}
	var groups []*group
	byKey := map[string]*group{}
	alone := &group{ready: true}
	for i, k := range keys {
		if k == "" || users[k] < 2 {
			alone.runs = append(alone.runs, i)
			continue
		}
		g := byKey[k]
		if g == nil {
			g = &group{pass: true}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.runs = append(g.runs, i)
	}
	if len(alone.runs) > 0 {
		groups = append(groups, alone)
	}
	passOf := func(g *group) error {
		c := cfgs[g.runs[0]]
		b, rec, err := runPass(c)
		if err != nil {
			return fmt.Errorf("sim: baselines of %s: %w", c.Scenario.Name, err)
		}
		g.base, g.rec = b, rec
		return nil
	}
	out := make([]*Result, len(cfgs))
	done := 0
	for gi, g := range groups {
		if !g.ready {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("sim: sweep stopped after %d of %d: %w", done, len(cfgs), err)
			}
			if err := passOf(g); err != nil {
				return nil, err
			}
			g.ready = true
		}
		// The group's runs, and the next group's pass as one more task.
		var next *group
		if gi+1 < len(groups) && !groups[gi+1].ready {
			next = groups[gi+1]
		}
		tasks := len(g.runs)
		if next != nil {
			tasks++
		}
		err := parallel(ctx, tasks, func(t int) {
			if t < len(g.runs) && progress != nil {
				done++
				progress(done, len(cfgs))
			}
		}, func(t int) error {
			if t == len(g.runs) {
				return passOf(next)
			}
			i := g.runs[t]
			res, err := run(cfgs[i], g.base, g.rec, true)
			if err != nil {
				return fmt.Errorf("sim: sweep run %d (%s): %w", i, cfgs[i].Scenario.Name, err)
			}
			out[i] = res
			return nil
		})
		if err != nil {
			return nil, err
		}
		if next != nil {
			next.ready = true
		}
		g.base, g.rec = nil, nil // the group is done: let the recording go
	}
	return out, nil
}

// parallel calls do(0..n-1) on up to GOMAXPROCS goroutines (in the
// caller's when that is 1), calls finished(i) in the caller's goroutine
// after each do(i) that succeeded, and returns the first error (the
// remaining indices are not started).
func parallel(ctx context.Context, n int, finished func(i int), do func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sim: sweep stopped after %d of %d: %w", i, n, err)
			}
			if err := do(i); err != nil {
				return err
			}
			finished(i)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	next := make(chan int)
	done := make(chan result)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				done <- result{i, do(i)}
			}
		}()
	}
	var first error
	sent, nDone := 0, 0
	stop := ctx.Done()
	for nDone < sent || (sent < n && first == nil) {
		var send chan int
		if sent < n && first == nil {
			send = next
		}
		select {
		case send <- sent:
			sent++
		case r := <-done:
			nDone++
			if r.err != nil && first == nil {
				first = r.err
			}
			if r.err == nil {
				finished(r.i)
			}
		case <-stop:
			stop = nil
			if first == nil {
				first = fmt.Errorf("sim: sweep stopped after %d of %d: %w", nDone, n, ctx.Err())
			}
		}
	}
	close(next)
	wg.Wait()
	return first
}

// streamKey identifies what a baseline pass of c depends on, or reports
// false when c wants no baselines.
func streamKey(c Config) (string, bool) {
	if c.NoBaselines {
		return "", false
	}
	sc, err := json.Marshal(c.Scenario)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%s|%d|%v|%d", sc, c.Seed, c.Allocator.Overcommit, c.SeriesBins), true
}
