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
// their baselines and merges them with the shared ones.
//
// Runs are independent and deterministic, so Sweep spreads them over
// GOMAXPROCS goroutines (each run stays single-threaded; GOMAXPROCS=1
// runs everything in order in one goroutine). progress, when not nil, is
// called in the caller's goroutine after each run with the runs done and
// the total. Sweep stops early when ctx is done and returns its error;
// every goroutine it started has returned when it returns.
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
	// Phase 1: one baseline pass per stream that two or more runs share.
	var passes []int // index of the first Config of each shared stream
	bases := map[string]*baseRun{}
	for i, k := range keys {
		if k != "" && users[k] > 1 {
			if _, ok := bases[k]; !ok {
				bases[k] = nil
				passes = append(passes, i)
			}
		}
	}
	passOut := make([]*baseRun, len(passes))
	if err := parallel(ctx, len(passes), nil, func(p int) error {
		b, err := runPass(cfgs[passes[p]])
		if err != nil {
			return fmt.Errorf("sim: baselines of %s: %w", cfgs[passes[p]].Scenario.Name, err)
		}
		passOut[p] = b
		return nil
	}); err != nil {
		return nil, err
	}
	for p, i := range passes {
		bases[keys[i]] = passOut[p]
	}
	// Phase 2: the runs.
	out := make([]*Result, len(cfgs))
	err := parallel(ctx, len(cfgs), progress, func(i int) error {
		res, err := run(cfgs[i], bases[keys[i]], true)
		if err != nil {
			return fmt.Errorf("sim: sweep run %d (%s): %w", i, cfgs[i].Scenario.Name, err)
		}
		out[i] = res
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parallel calls do(0..n-1) on up to GOMAXPROCS goroutines (in the
// caller's when that is 1), reports each completion to progress in the
// caller's goroutine, and returns the first error (the remaining indices
// are not started).
func parallel(ctx context.Context, n int, progress func(done, total int), do func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sim: sweep stopped after %d of %d: %w", i, n, err)
			}
			if err := do(i); err != nil {
				return err
			}
			if progress != nil {
				progress(i+1, n)
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	done := make(chan error)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				done <- do(i)
			}
		}()
	}
	var first error
	sent, finished := 0, 0
	stop := ctx.Done()
	for finished < sent || (sent < n && first == nil) {
		var send chan int
		if sent < n && first == nil {
			send = next
		}
		select {
		case send <- sent:
			sent++
		case err := <-done:
			finished++
			if err != nil && first == nil {
				first = err
			}
			if err == nil && progress != nil {
				progress(finished, n)
			}
		case <-stop:
			stop = nil
			if first == nil {
				first = fmt.Errorf("sim: sweep stopped after %d of %d: %w", finished, n, ctx.Err())
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
