package regional

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineSlices is how many slices a store budget is cut into: checks
// that start within one slice share one deadline context.
const deadlineSlices = 8

// deadlines hands out the contexts of store calls: each ends budget after
// the call asks for it, or up to one slice (budget/deadlineSlices) later.
// Calls that start within one slice share one context and so one timer,
// where a context.WithTimeout per call started (and stopped) a timer of
// its own, several allocations and a few microseconds per check.
//
// The contexts carry no values and do not end with the caller's context:
// a check whose caller went away waits for the store at most its budget
// (callers that need the caller's context, such as a traced call, derive
// their own). Safe for concurrent use; the zero value is not usable (see
// newDeadlines).
type deadlines struct {
	budget, slice time.Duration
	cur           atomic.Pointer[sharedDeadline]
}

type sharedDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc // kept for vet; the timer ends ctx at its deadline
	from   time.Time          // the slice starts here (monotonic reading)
}

func newDeadlines(budget time.Duration) *deadlines {
	return &deadlines{budget: budget, slice: budget / deadlineSlices}
}

// get returns a context that ends between budget and budget + slice from
// now.
func (d *deadlines) get() context.Context {
	now := time.Now()
	if c := d.cur.Load(); c != nil {
		if age := now.Sub(c.from); age >= 0 && age < d.slice {
			return c.ctx
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(d.budget+d.slice))
	d.cur.Store(&sharedDeadline{ctx: ctx, cancel: cancel, from: now})
	return ctx
}
