package bucket_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// TestRedisDropsCallsPastTheirDeadline: a paused Redis (CLIENT PAUSE) holds
// a call sent by its caller (the only one in the store, it goes direct)
// and one the store's one flusher sent (it came while the first was in
// flight); meanwhile a Take, a TakeAll and a Refund are queued behind them
// with a 50 ms deadline, and their callers give up. When Redis resumes,
// none of them is sent: the buckets they named are as they were. A caller
// whose check ended must never have its take written afterwards, at a
// share its region may since have acknowledged giving up.
func TestRedisDropsCallsPastTheirDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Flushers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx := context.Background()
	lim := bucket.Limits{Capacity: 5, RefillPerSecond: 0.001, IdleTTL: 2 * time.Hour}
	req := func(subject string, cost int64) bucket.Request {
		k, err := bucket.NewKey("deadline", 1, subject)
		if err != nil {
			t.Fatal(err)
		}
		return bucket.Request{Key: k, Limits: lim, Share: 1, Cost: cost}
	}
	// The refund's bucket starts at 2 of 5 tokens.
	if d, err := r.Take(ctx, req("refunded", 3)); err != nil || !d.Allowed {
		t.Fatalf("setup take: %+v, %v", d, err)
	}

	pause := srv.Client(t)
	if err := pause.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	inFlight := make(chan error, 2)
	for _, subject := range []string{"first", "second"} {
		go func() {
			_, err := r.Take(ctx, req(subject, 1))
			inFlight <- err
		}()
		// "first" is now in flight on its caller's goroutine, then the
		// flusher is waiting on "second".
		time.Sleep(200 * time.Millisecond)
	}

	late := func(what string, call func(context.Context) error) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := call(dctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s queued behind a paused Redis: %v, want the deadline's error", what, err)
		}
	}
	late("take", func(ctx context.Context) error { _, err := r.Take(ctx, req("taken", 5)); return err })
	late("take-all", func(ctx context.Context) error {
		_, err := r.TakeAll(ctx, []bucket.Request{req("all1", 5), req("all2", 5)})
		return err
	})
	late("refund", func(ctx context.Context) error { _, err := r.Refund(ctx, req("refunded", 3)); return err })
	for range 2 {
		if err := <-inFlight; err != nil {
			t.Fatalf("a call in flight when Redis paused: %v", err)
		}
	}

	for subject, want := range map[string]float64{"taken": 5, "all1": 5, "all2": 5, "refunded": 2} {
		d, err := r.Take(ctx, req(subject, 0))
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining < want || d.Remaining > want+0.1 { // refill adds 0.001 a second
			t.Errorf("bucket %q holds %v after its caller gave up, want %v: the call was sent after its deadline", subject, d.Remaining, want)
		}
	}
}
