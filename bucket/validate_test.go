package bucket_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

func goodLimits() bucket.Limits {
	return bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: 10 * time.Second}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*bucket.Limits)
		ok   bool
	}{
		{"token bucket", func(*bucket.Limits) {}, true},
		{"no refill", func(l *bucket.Limits) { l.RefillPerSecond = 0 }, true},
		{"unknown algorithm", func(l *bucket.Limits) { l.Algorithm = "leaky" }, false},
		{"zero capacity", func(l *bucket.Limits) { l.Capacity = 0 }, false},
		{"negative capacity", func(l *bucket.Limits) { l.Capacity = -1 }, false},
		{"capacity overflow", func(l *bucket.Limits) { l.Capacity = bucket.MaxCapacity + 1; l.IdleTTL = bucket.MaxIdleTTL }, false},
		{"negative refill", func(l *bucket.Limits) { l.RefillPerSecond = -1 }, false},
		{"NaN refill", func(l *bucket.Limits) { l.RefillPerSecond = math.NaN() }, false},
		{"Inf refill", func(l *bucket.Limits) { l.RefillPerSecond = math.Inf(1) }, false},
		{"TTL shorter than full refill", func(l *bucket.Limits) { l.IdleTTL = 9 * time.Second }, false},
		{"TTL exactly full refill", func(l *bucket.Limits) { l.IdleTTL = 10 * time.Second }, true},
		{"zero TTL", func(l *bucket.Limits) { l.IdleTTL = 0 }, false},
		{"TTL too long", func(l *bucket.Limits) { l.IdleTTL = bucket.MaxIdleTTL + 1 }, false},
		{"NaN overcommit", func(l *bucket.Limits) { l.Overcommit = math.NaN() }, false},
		{"negative overcommit", func(l *bucket.Limits) { l.Overcommit = -0.1 }, false},
		{"overcommit too big", func(l *bucket.Limits) { l.Overcommit = 2 }, false},
		{"fixed window", func(l *bucket.Limits) { l.Algorithm = bucket.FixedWindow; l.Window = time.Second }, true},
		{"fixed window no window", func(l *bucket.Limits) { l.Algorithm = bucket.FixedWindow }, false},
		{"fixed window TTL below window", func(l *bucket.Limits) { l.Algorithm = bucket.FixedWindow; l.Window = time.Minute }, false},
		{"sliding window TTL one window", func(l *bucket.Limits) { l.Algorithm = bucket.SlidingWindow; l.Window = 10 * time.Second }, false},
		{"sliding window TTL two windows", func(l *bucket.Limits) { l.Algorithm = bucket.SlidingWindow; l.Window = 5 * time.Second }, true},
		{"sliding log", func(l *bucket.Limits) { l.Algorithm = bucket.SlidingLog; l.Window = time.Second }, true},
		{"sliding log too big", func(l *bucket.Limits) {
			l.Algorithm = bucket.SlidingLog
			l.Window = time.Second
			l.Capacity = bucket.MaxSlidingLogCapacity + 1
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := goodLimits()
			tt.mod(&l)
			err := l.Validate()
			if tt.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, bucket.ErrInvalidLimits) {
				t.Fatalf("error %v is not ErrInvalidLimits", err)
			}
		})
	}
}

func TestRequestValidate(t *testing.T) {
	key, err := bucket.NewKey("export", 1, "tenant-1")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		mod  func(*bucket.Request)
		ok   bool
	}{
		{"valid", func(*bucket.Request) {}, true},
		{"peek", func(r *bucket.Request) { r.Cost = 0 }, true},
		{"zero key", func(r *bucket.Request) { r.Key = bucket.Key{} }, false},
		{"bad limits", func(r *bucket.Request) { r.Limits.Capacity = 0 }, false},
		{"zero share", func(r *bucket.Request) { r.Share = 0 }, false},
		{"NaN share", func(r *bucket.Request) { r.Share = math.NaN() }, false},
		{"share above 1", func(r *bucket.Request) { r.Share = 1.01 }, false},
		{"share within overcommit", func(r *bucket.Request) { r.Share = 1.1; r.Limits.Overcommit = 0.1 }, true},
		{"negative cost", func(r *bucket.Request) { r.Cost = -1 }, false},
		{"cost above capacity", func(r *bucket.Request) { r.Cost = 11 }, false},
		{"cost above f·C is a denial, not an error", func(r *bucket.Request) { r.Share = 0.1; r.Cost = 5 }, true},
		{"f·C overflow", func(r *bucket.Request) {
			r.Limits.Capacity = bucket.MaxCapacity
			r.Limits.IdleTTL = bucket.MaxIdleTTL
			r.Limits.Overcommit = 1
			r.Share = 1.5
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bucket.Request{Key: key, Limits: goodLimits(), Share: 1, Cost: 1}
			tt.mod(&r)
			err := r.Validate()
			if tt.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, bucket.ErrInvalidRequest) {
				t.Fatalf("error %v is not ErrInvalidRequest", err)
			}
		})
	}
}
