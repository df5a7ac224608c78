package demo

import (
	"sync"
	"time"
)

// Event is one decided request of the merged stream: when it arrived
// (offset from the start of the story), in which region, for which subject
// (an index; the story's single subject is 0), and whether it was
// admitted.
type Event struct {
	At       time.Duration
	Region   int
	Subject  int32
	Cost     int64
	Admitted bool
}

// Bin is the fixed width of the recorder's time series.
const Bin = 100 * time.Millisecond

// MaxEvents bounds the events a Recorder keeps; later events are counted
// in the series but dropped from the stream (Dropped says how many).
const MaxEvents = 4_000_000

// Recorder collects decisions from the driver's workers. It is safe for
// concurrent use; the zero value is not usable, use NewRecorder.
type Recorder struct {
	mu       sync.Mutex
	regions  int
	bins     int
	offered  [][]int64 // [region][bin] cost
	admitted [][]int64
	errors   []int64 // per region
	shed     []int64 // per region: arrivals the driver could not send in time
	share    []float64
	// published: shares come from SetShares (the published allocation),
	// not from decisions.
	published bool
	events    []Event
	dropped   int64
}

// NewRecorder returns a recorder for regions over length (longer runs
// fold into the last bin).
func NewRecorder(regions int, length time.Duration) *Recorder {
	bins := int(length/Bin) + 1
	r := &Recorder{regions: regions, bins: bins, errors: make([]int64, regions), shed: make([]int64, regions), share: make([]float64, regions)}
	r.offered = make([][]int64, regions)
	r.admitted = make([][]int64, regions)
	for i := range r.offered {
		r.offered[i] = make([]int64, bins)
		r.admitted[i] = make([]int64, bins)
	}
	return r
}

func (r *Recorder) bin(at time.Duration) int {
	b := int(at / Bin)
	if b < 0 {
		return 0
	}
	if b >= r.bins {
		return r.bins - 1
	}
	return b
}

// Decision records one decided request; share is the share the region
// reported enforcing (ignored when not positive).
func (r *Recorder) Decision(e Event, share float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.bin(e.At)
	r.offered[e.Region][b] += e.Cost
	if e.Admitted {
		r.admitted[e.Region][b] += e.Cost
	}
	if share > 0 && !r.published {
		r.share[e.Region] = share
	}
	if len(r.events) < MaxEvents {
		r.events = append(r.events, e)
	} else {
		r.dropped++
	}
}

// Error records a request that failed (not a denial): it counts as
// offered, not admitted.
func (r *Recorder) Error(at time.Duration, region int, cost int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.offered[region][r.bin(at)] += cost
	r.errors[region]++
	if len(r.events) < MaxEvents {
		r.events = append(r.events, Event{At: at, Region: region, Cost: cost})
	} else {
		r.dropped++
	}
}

// SetShares sets every region's share, as published by the coordinator;
// from then on decisions no longer set shares.
func (r *Recorder) SetShares(shares []float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.published = true
	copy(r.share, shares)
}

// ClearShare forgets region's last reported share (its node stopped).
func (r *Recorder) ClearShare(region int) {
	r.mu.Lock()
	r.share[region] = 0
	r.mu.Unlock()
}

// Shed records arrivals the driver had no worker for.
func (r *Recorder) Shed(region int, n int64) {
	r.mu.Lock()
	r.shed[region] += n
	r.mu.Unlock()
}

// Window is the per-region view of an interval.
type Window struct {
	Offered, Admitted []float64 // per second
	Share             []float64 // last reported
	Errors, Shed      []int64   // totals so far
}

// Rates returns the offered and admitted rates per region over [from, to).
func (r *Recorder) Rates(from, to time.Duration) Window {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := Window{
		Offered: make([]float64, r.regions), Admitted: make([]float64, r.regions),
		Share:  append([]float64(nil), r.share...),
		Errors: append([]int64(nil), r.errors...), Shed: append([]int64(nil), r.shed...),
	}
	lo, hi := r.bin(from), r.bin(to-1)
	if to <= from {
		return w
	}
	secs := float64(hi-lo+1) * Bin.Seconds()
	for i := 0; i < r.regions; i++ {
		var o, a int64
		for b := lo; b <= hi; b++ {
			o += r.offered[i][b]
			a += r.admitted[i][b]
		}
		w.Offered[i] = float64(o) / secs
		w.Admitted[i] = float64(a) / secs
	}
	return w
}

// Events returns a copy of the recorded stream sorted by arrival, and how
// many events did not fit.
func (r *Recorder) Events() ([]Event, int64) {
	r.mu.Lock()
	out := append([]Event(nil), r.events...)
	d := r.dropped
	r.mu.Unlock()
	sortEvents(out)
	return out, d
}
