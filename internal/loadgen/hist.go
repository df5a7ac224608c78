package loadgen

import (
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram over nanoseconds: values below
// 256 ns are exact; above, each power of two is split into 128 buckets.
type hist struct {
	counts []uint64
	n      uint64
	sum    time.Duration
	max    time.Duration
}

const histBuckets = 256 + 56*128

func newHist() *hist { return &hist{counts: make([]uint64, histBuckets)} }

func bucketOf(v int64) int {
	if v < 256 {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	e := bits.Len64(uint64(v)) - 8
	m := v >> e
	return 256 + (e-1)*128 + int(m-128)
}

// lowerBound is the smallest value in bucket i.
func lowerBound(i int) int64 {
	if i < 256 {
		return int64(i)
	}
	e := (i-256)/128 + 1
	m := int64((i-256)%128 + 128)
	return m << e
}

func (h *hist) record(d time.Duration) {
	i := bucketOf(int64(d))
	if i >= len(h.counts) {
		i = len(h.counts) - 1
	}
	h.counts[i]++
	h.n++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// quantile returns the lower bound of the bucket holding the q-quantile.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if rank >= h.n {
		rank = h.n - 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return time.Duration(lowerBound(i))
		}
	}
	return h.max
}

func (h *hist) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}
