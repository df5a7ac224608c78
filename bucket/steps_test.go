package bucket_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// t0 is aligned to every window used below.
var t0 = time.Unix(1_800_000_000, 0)

// step is one call at t0+at. op is "take", "peek" or "refund".
type step struct {
	at    time.Duration
	op    string
	cost  int64
	share float64 // 0 means 1
	want  bucket.Decision
}

// driver runs one call at an instant, on Memory or on Redis.
type driver interface {
	do(now time.Time, op string, req bucket.Request) (bucket.Decision, error)
}

type memDriver struct{ m *bucket.Memory }

func (d memDriver) do(now time.Time, op string, req bucket.Request) (bucket.Decision, error) {
	if op == "refund" {
		return d.m.RefundAt(now, req)
	}
	return d.m.TakeAt(now, req)
}

type redisDriver struct {
	r   *bucket.Redis
	now *int64
}

func (d redisDriver) do(now time.Time, op string, req bucket.Request) (bucket.Decision, error) {
	*d.now = now.UnixMicro()
	if op == "refund" {
		return d.r.Refund(context.Background(), req)
	}
	return d.r.Take(context.Background(), req)
}

var s = time.Second
var ms = time.Millisecond

var stepTables = []struct {
	name   string
	limits bucket.Limits
	// withheld is every request's Withheld, at most the smallest share
	// of the table's steps.
	withheld float64
	// since is every request's Since (zero: none).
	since time.Time
	steps []step
}{
	{
		name:   "token bucket",
		limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * s},
		steps: []step{
			{0, "take", 3, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 3 * s}},
			{0, "take", 8, 0, bucket.Decision{Limit: 10, Remaining: 7, RetryAfter: s, ResetAfter: 3 * s}},
			{500 * ms, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 7.5, ResetAfter: 2500 * ms}},
			{s, "take", 8, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
			// time steps back: no refill, no credit
			{500 * ms, "take", 1, 0, bucket.Decision{Limit: 10, Remaining: 0, RetryAfter: s, ResetAfter: 10 * s}},
			{1250 * ms, "take", 1, 0, bucket.Decision{Limit: 10, Remaining: 0.25, RetryAfter: 750 * ms, ResetAfter: 9750 * ms}},
			// exact boundary: one whole token at 2s
			{2 * s, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
			// refill to capacity, no further
			{30 * s, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 10}},
			{30 * s, "take", 9, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 1, ResetAfter: 9 * s}},
			// share shrinks: stored tokens clamp to f·C, and the clamp is written
			{34 * s, "take", 1, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 4, ResetAfter: 6 * s}},
			{34 * s, "peek", 0, 0.3, bucket.Decision{Allowed: true, Limit: 3, Remaining: 3}},
			// share grows back: no tokens at once, refill at f·r
			{34 * s, "peek", 0, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 7 * s}},
			{36 * s, "take", 5, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
			// refund, capped at capacity
			{36 * s, "refund", 3, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 7 * s}},
			{36 * s, "refund", 10, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 10}},
			// weighted cost above f·C: denied at this share
			{36 * s, "take", 6, 0.5, bucket.Decision{Limit: 5, Remaining: 5, RetryAfter: 10 * s}},
			// idle TTL passed: a full bucket
			{36*s + 20*s, "take", 10, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
		},
	},
	{
		name:   "token bucket share grows",
		limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * s},
		steps: []step{
			{0, "take", 5, 0.5, bucket.Decision{Allowed: true, Limit: 5, Remaining: 0, ResetAfter: 10 * s}},
			// grown to 1: the 4s since the last write refill at 0.5/s
			// (2 tokens, not 4), and the peek writes the new capacity
			{4 * s, "peek", 0, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 8 * s}},
			// from then on refill at 1/s
			{6 * s, "take", 4, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
			// shrunk to 0.5: the time since the last write refills at 0.5/s
			{8 * s, "take", 1, 0.5, bucket.Decision{Allowed: true, Limit: 5, Remaining: 0, ResetAfter: 10 * s}},
			// grown after a long idle: full at the old capacity 5, not 10
			{25 * s, "peek", 0, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: 5 * s}},
			{25 * s, "take", 6, 1, bucket.Decision{Limit: 10, Remaining: 5, RetryAfter: s, ResetAfter: 5 * s}},
			{26 * s, "take", 6, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
		},
	},
	{
		name:   "token bucket grown, denial writes the capacity",
		limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * s},
		steps: []step{
			{0, "take", 2, 0.2, bucket.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * s}},
			// a cost above the old capacity, denied: the new capacity is
			// written all the same, so the bucket can grow past 2
			{10 * s, "take", 5, 1, bucket.Decision{Limit: 10, Remaining: 2, RetryAfter: 3 * s, ResetAfter: 8 * s}},
			{13 * s, "take", 5, 1, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
		},
	},
	{
		name:     "token bucket created below full",
		limits:   bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * s},
		withheld: 0.7,
		steps: []step{
			// a new bucket holds (1 - 0.7)·10 = 3, and the denial writes
			// it, so that it refills from now
			{0, "take", 5, 0, bucket.Decision{Limit: 10, Remaining: 3, RetryAfter: 2 * s, ResetAfter: 7 * s}},
			{2 * s, "take", 5, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
			// a live bucket is not touched by withheld: it refills to full
			{12 * s, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 10}},
			{12 * s, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: s}},
			// idle past the TTL: created again, at 3
			{32 * s, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 7 * s}},
			// at share 0.8 a new-born bucket holds (0.8 - 0.7)·10 = 1
			{60 * s, "take", 2, 0.8, bucket.Decision{Limit: 8, Remaining: 1, RetryAfter: 1250 * ms, ResetAfter: 8750 * ms}},
		},
	},
	{
		name:   "token bucket under a key version younger than a refill",
		limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 20 * s},
		since:  t0,
		steps: []step{
			// absent under a key version that began now: read as a bucket
			// emptied at t0 (its spending under the old version is
			// unknown), written so that it refills from t0
			{0, "take", 5, 0, bucket.Decision{Limit: 10, Remaining: 0, RetryAfter: 5 * s, ResetAfter: 10 * s}},
			{4 * s, "take", 5, 0, bucket.Decision{Limit: 10, Remaining: 4, RetryAfter: s, ResetAfter: 6 * s}},
			{5 * s, "take", 5, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * s}},
			// idle past the TTL, a refill time after since: full again
			{40 * s, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 10}},
		},
	},
	{
		name:   "token bucket without refill under a young key version",
		limits: bucket.Limits{Capacity: 2, IdleTTL: 10 * s},
		since:  t0.Add(s),
		steps: []step{
			// emptied at t0+1s: its allowance returns 10s later
			{3 * s, "take", 1, 0, bucket.Decision{Limit: 2, Remaining: 0, RetryAfter: 8 * s, ResetAfter: 8 * s}},
			{11 * s, "take", 2, 0, bucket.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * s}},
		},
	},
	{
		name:   "fixed window under a key version younger than the window",
		limits: bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 3, Window: s, IdleTTL: s},
		since:  t0.Add(500 * ms),
		steps: []step{
			// the window that holds since reads as full
			{600 * ms, "take", 1, 0, bucket.Decision{Limit: 3, Remaining: 0, RetryAfter: 400 * ms, ResetAfter: 400 * ms}},
			{s, "take", 3, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: s}},
		},
	},
	{
		name:   "sliding window under a young key version",
		limits: bucket.Limits{Algorithm: bucket.SlidingWindow, Capacity: 10, Window: s, IdleTTL: 2 * s},
		since:  t0,
		steps: []step{
			{0, "take", 1, 0, bucket.Decision{Limit: 10, Remaining: 0, RetryAfter: 1100 * ms, ResetAfter: 2 * s}},
			// the next window weighs the full count as the previous one
			{1100 * ms, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 1900 * ms}},
		},
	},
	{
		name:   "sliding log under a young key version",
		limits: bucket.Limits{Algorithm: bucket.SlidingLog, Capacity: 3, Window: 10 * s, IdleTTL: 10 * s},
		since:  t0,
		steps: []step{
			{0, "take", 1, 0, bucket.Decision{Limit: 3, Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s}},
			{10 * s, "take", 3, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 10 * s}},
		},
	},
	{
		name:   "token bucket without refill",
		limits: bucket.Limits{Capacity: 2, IdleTTL: 10 * s},
		steps: []step{
			{0, "take", 2, 0, bucket.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * s}},
			{4 * s, "take", 1, 0, bucket.Decision{Limit: 2, Remaining: 0, RetryAfter: 6 * s, ResetAfter: 6 * s}},
			{10 * s, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 10 * s}},
		},
	},
	{
		name:   "fixed window",
		limits: bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 3, Window: s, IdleTTL: s},
		steps: []step{
			{0, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: s}},
			{100 * ms, "take", 2, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 900 * ms}},
			{999 * ms, "take", 1, 0, bucket.Decision{Limit: 3, Remaining: 0, RetryAfter: ms, ResetAfter: ms}},
			{999 * ms, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: ms}},
			{s, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: s}},
			{s, "refund", 3, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 3, ResetAfter: s}},
			{1500 * ms, "take", 2, 0.5, bucket.Decision{Limit: 1.5, Remaining: 1.5, RetryAfter: 500 * ms, ResetAfter: 500 * ms}},
		},
	},
	{
		name:   "sliding window",
		limits: bucket.Limits{Algorithm: bucket.SlidingWindow, Capacity: 10, Window: s, IdleTTL: 2 * s},
		steps: []step{
			{0, "take", 10, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 2 * s}},
			{s, "take", 1, 0, bucket.Decision{Limit: 10, Remaining: 0, RetryAfter: 100 * ms, ResetAfter: s}},
			{1100 * ms, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 1900 * ms}},
			{1500 * ms, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 4, ResetAfter: 1500 * ms}},
			{1500 * ms, "refund", 1, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: 500 * ms}},
			{5 * s, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 10, Remaining: 10}},
		},
	},
	{
		name:   "sliding log",
		limits: bucket.Limits{Algorithm: bucket.SlidingLog, Capacity: 3, Window: 10 * s, IdleTTL: 10 * s},
		steps: []step{
			{0, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 10 * s}},
			{s, "take", 2, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 10 * s}},
			{5 * s, "take", 1, 0, bucket.Decision{Limit: 3, Remaining: 0, RetryAfter: 5 * s, ResetAfter: 6 * s}},
			{5 * s, "take", 3, 0, bucket.Decision{Limit: 3, Remaining: 0, RetryAfter: 6 * s, ResetAfter: 6 * s}},
			// exact boundary: the entry at 0 leaves the window (t-10s, t] at 10s
			{10 * s, "take", 1, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 10 * s}},
			{10 * s, "refund", 2, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: s}},
			{30 * s, "peek", 0, 0, bucket.Decision{Allowed: true, Limit: 3, Remaining: 3}},
		},
	},
}

func runSteps(t *testing.T, d driver, subject string) {
	t.Helper()
	_, state := d.(stateDriver)
	for n, tab := range stepTables {
		if state && (tab.withheld != 0 || !tab.since.IsZero()) {
			// Not State's tables: a State starts new buckets full;
			// Request.Withheld and Since are the stores' (Memory, Redis),
			// which run every table.
			continue
		}
		t.Run(tab.name, func(t *testing.T) {
			key, err := bucket.NewKey("steps", 1, subject+"-"+fmt.Sprint(n))
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tab.steps {
				share := st.share
				if share == 0 {
					share = 1
				}
				req := bucket.Request{Key: key, Limits: tab.limits, Share: share, Cost: st.cost, Withheld: tab.withheld, Since: tab.since}
				at := t0.Add(st.at)
				got, err := d.do(at, st.op, req)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				// Every store tells the instant it decided at: the step's.
				want := st.want
				want.At = at.UTC()
				if got != want {
					t.Errorf("step %d (%s %d at %v, share %v):\n got %+v\nwant %+v", i, st.op, st.cost, st.at, share, got, want)
				}
			}
		})
	}
}

func TestMemorySteps(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	runSteps(t, memDriver{m}, "mem")
}
