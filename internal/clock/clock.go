package clock

import (
	"sync"
	"time"
)

// Clock tells the current time.
type Clock interface {
	Now() time.Time
}

// Monotonic is a clock with a reading that moves forward at the rate of
// real time and never jumps: stepping the wall clock (NTP, an operator, a
// virtual machine resumed with a corrected clock) does not move it.
// Durations that bound safety, such as a lease's age, are measured on it;
// timestamps that other processes read stay on the wall clock (Now).
type Monotonic interface {
	Clock
	// Mono returns the time elapsed since a fixed origin of the clock.
	// Only differences of two readings of one clock mean anything.
	Mono() time.Duration
}

// Real is the wall clock, with the process's monotonic clock as its
// monotonic reading. Its zero value is ready to use.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// origin is the origin of Real's monotonic readings.
var origin = time.Now()

// Mono returns the monotonic time since the process loaded this package.
func (Real) Mono() time.Duration { return time.Since(origin) }

// MonotonicOf returns c when it is Monotonic, else c with Real's
// monotonic reading: real time elapsed, whatever c's wall readings do.
func MonotonicOf(c Clock) Monotonic {
	if m, ok := c.(Monotonic); ok {
		return m
	}
	return withRealMono{c}
}

type withRealMono struct{ Clock }

func (withRealMono) Mono() time.Duration { return Real{}.Mono() }

// Manual is a clock that moves only when told to. It is safe for concurrent
// use. The zero value starts at the zero time with monotonic reading 0;
// NewManual starts elsewhere.
type Manual struct {
	mu   sync.Mutex
	now  time.Time
	mono time.Duration
}

// NewManual returns a Manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's current wall reading.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Mono returns the clock's monotonic reading: the sum of the forward
// Advances since the clock was made.
func (m *Manual) Mono() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mono
}

// Advance moves the clock by d and returns the new wall reading. A d ≥ 0
// is time passing: both readings move. A negative d steps the wall clock
// back, as NTP or an operator would, and leaves the monotonic reading
// where it is.
func (m *Manual) Advance(d time.Duration) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	if d > 0 {
		m.mono += d
	}
	return m.now
}

// Set steps the wall clock to t; the monotonic reading does not move.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = t
}
