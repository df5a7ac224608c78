package regional

import (
	"testing"
	"time"
)

// TestDeadlines: a store call's context ends no sooner than its budget
// and at most one slice later; calls within one slice share a context,
// and a later call gets a new one.
func TestDeadlines(t *testing.T) {
	for _, budget := range []time.Duration{5 * time.Millisecond, 80 * time.Millisecond, time.Second} {
		d := newDeadlines(budget)
		ctx := d.get()
		after := time.Now()
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatalf("budget %v: no deadline", budget)
		}
		if dl.Before(after.Add(budget)) || dl.After(after.Add(budget+budget/deadlineSlices)) {
			t.Fatalf("budget %v: deadline %v after the call, want %v to %v", budget, dl.Sub(after), budget, budget+budget/deadlineSlices)
		}
		if budget >= time.Second && d.get() != ctx {
			t.Fatalf("budget %v: a call within the slice got another context", budget)
		}
		time.Sleep(budget/deadlineSlices + time.Millisecond)
		later := d.get()
		if later == ctx {
			t.Fatalf("budget %v: a call after the slice shares the old context", budget)
		}
		if dl2, _ := later.Deadline(); !dl2.After(dl) {
			t.Fatalf("budget %v: later deadline %v not after %v", budget, dl2, dl)
		}
	}
	d := newDeadlines(5 * time.Millisecond)
	ctx := d.get()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("a shared deadline context never ended")
	}
}
