package rlqs

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/internal/policy"
)

// tokenBucket is an assignment's token bucket as the filter reads it:
// MaxTokens at once, PerFill tokens every Fill (whole seconds), refilled
// continuously at PerFill/Fill.
type tokenBucket struct {
	MaxTokens, PerFill uint32
	Fill               time.Duration
}

// rate is the bucket's refill in tokens per second.
func (b tokenBucket) rate() float64 { return float64(b.PerFill) / b.Fill.Seconds() }

// tokenBucketFor returns the token bucket that refills at most rate tokens
// per second with whole-second fill intervals (the filter truncates
// fractions): one second and ⌊rate⌋ tokens, or for a rate under one, one
// token every ⌈1/rate⌉ seconds. Its burst is one fill. ok is false when
// rate is below one token per MaxFillInterval.
func tokenBucketFor(rate float64) (tokenBucket, bool) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return tokenBucket{}, false
	}
	if rate >= 1 {
		n := uint32(min(math.Floor(rate), math.MaxUint32))
		return tokenBucket{MaxTokens: n, PerFill: n, Fill: time.Second}, true
	}
	secs := math.Ceil(1/rate - 1e-9)
	if secs > MaxFillInterval.Seconds() {
		return tokenBucket{}, false
	}
	return tokenBucket{MaxTokens: 1, PerFill: 1, Fill: time.Duration(secs) * time.Second}, true
}

// demandRate is what one usage report says an Envoy was offered, in
// requests per second: allowed plus denied over the elapsed time. The
// filter sends time_elapsed in whole seconds and may send 0 (a bucket's
// first report, or less than a second since the last); the server then
// uses the time it measured since the bucket's previous report, or, for
// a first report, fallback.
func demandRate(allowed, denied uint64, elapsed, measured, fallback time.Duration) float64 {
	d := elapsed
	if d <= 0 {
		d = measured
	}
	if d <= 0 {
		d = fallback
	}
	return float64(allowed+denied) / max(d.Seconds(), 1e-3)
}

// split divides rate among consumers by demand, max-min fair (water-filling,
// spare spread evenly so none sits idle), with the allocator the regions'
// shares use. demands are requests per second; the result is in the same
// order, in requests per second, and sums to at most rate.
func split(rate float64, demands []float64) []float64 {
	out := make([]float64, len(demands))
	if rate <= 0 || len(demands) == 0 {
		return out
	}
	rs := make([]allocator.Region, len(demands))
	for i, d := range demands {
		rs[i] = allocator.Region{Name: strconv.Itoa(i), Demand: max(0, d/rate), Live: true}
	}
	shares, err := allocator.Target(allocator.Params{Algorithm: allocator.MaxMinFair}, rs)
	if err != nil {
		// Unreachable with valid inputs (no minimums, no pins): fall back
		// to an even split.
		for i := range out {
			out[i] = rate / float64(len(out))
		}
		return out
	}
	for i, s := range shares {
		out[i] = max(0, min(1, s)) * rate * (1 - allocator.Tolerance)
	}
	return out
}

// descriptor orders a bucket id's entries: the keys of order first, in
// that order, then the others sorted.
func descriptor(id map[string]string, order []string) []policy.Entry {
	out := make([]policy.Entry, 0, len(id))
	seen := 0
	for _, k := range order {
		if v, ok := id[k]; ok {
			out = append(out, policy.Entry{Key: k, Value: v})
			seen++
		}
	}
	if seen == len(id) {
		return out
	}
	rest := make([]string, 0, len(id)-seen)
	for k := range id {
		if !slices.Contains(order, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		out = append(out, policy.Entry{Key: k, Value: id[k]})
	}
	return out
}

// idKey is a bucket id's canonical form (sorted keys), for maps.
func idKey(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(id[k])
		b.WriteByte(0)
	}
	return b.String()
}
