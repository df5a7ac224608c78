package bucket_test

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

func TestCountedSince(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 42, 30, 0, time.UTC)
	skew := time.Second
	cases := []struct {
		alg    bucket.Algorithm
		window time.Duration
		want   time.Time
		ok     bool
	}{
		{bucket.FixedWindow, time.Minute, time.Date(2026, 12, 1, 15, 42, 0, 0, time.UTC).Add(-skew), true},
		{bucket.FixedWindow, time.Hour, time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC).Add(-skew), true},
		{bucket.FixedWindow, 24 * time.Hour, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(-skew), true},
		{bucket.SlidingWindow, time.Minute, time.Date(2026, 12, 1, 15, 41, 0, 0, time.UTC).Add(-skew), true},
		{bucket.SlidingLog, time.Minute, now.Add(-time.Minute - skew), true},
		{bucket.TokenBucket, 0, time.Time{}, false},
		{"", 0, time.Time{}, false},
	}
	for _, c := range cases {
		got, ok := bucket.Limits{Algorithm: c.alg, Capacity: 10, Window: c.window}.CountedSince(now, skew)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("%s %v: CountedSince = %v, %v; want %v, %v", c.alg, c.window, got, ok, c.want, c.ok)
		}
	}
}
