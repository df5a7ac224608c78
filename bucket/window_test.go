package bucket_test

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

func TestCountedFor(t *testing.T) {
	skew := time.Second
	cases := []struct {
		alg    bucket.Algorithm
		window time.Duration
		want   time.Duration
		ok     bool
	}{
		{bucket.FixedWindow, time.Minute, time.Minute + skew, true},
		{bucket.FixedWindow, 24 * time.Hour, 24*time.Hour + skew, true},
		{bucket.SlidingWindow, time.Minute, 2*time.Minute + skew, true},
		{bucket.SlidingLog, time.Minute, time.Minute + skew, true},
		{bucket.TokenBucket, 0, 0, false},
		{"", 0, 0, false},
	}
	for _, c := range cases {
		got, ok := bucket.Limits{Algorithm: c.alg, Capacity: 10, Window: c.window}.CountedFor(skew)
		if ok != c.ok || got != c.want {
			t.Errorf("%s %v: CountedFor = %v, %v; want %v, %v", c.alg, c.window, got, ok, c.want, c.ok)
		}
	}
}
