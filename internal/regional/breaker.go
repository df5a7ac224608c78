package regional

import (
	"sync/atomic"
	"time"
)

// breaker is a consecutive-failure circuit breaker in front of the store.
//
// Closed: every call goes to the store. After threshold consecutive
// failures it opens until now+cooldown; while open no call goes to the store,
// so a dead Redis costs no time. Once the cooldown has passed it is half-open:
// exactly one caller at a time is let through as a probe; its success closes
// the breaker, its failure opens it for another cooldown.
//
// It is lock-free and safe for concurrent use. The zero value is not usable;
// build it with newBreaker.
type breaker struct {
	threshold int64
	cooldown  time.Duration

	failures  atomic.Int64
	openUntil atomic.Int64 // unix nanoseconds; 0 means closed
	probing   atomic.Bool
	opens     atomic.Int64 // how many times it opened, for tests and logs
}

func newBreaker(threshold int, cooldown time.Duration) *breaker {
	if threshold < 1 {
		threshold = 1
	}
	return &breaker{threshold: int64(threshold), cooldown: cooldown}
}

// allow reports whether a call may go to the store at now, and whether that
// call is the half-open probe (which must be reported with probe=true).
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if now.UnixNano() < until {
		return false, false
	}
	if b.probing.CompareAndSwap(false, true) {
		return true, true
	}
	return false, false
}

// success records a store call that answered.
func (b *breaker) success(probe bool) {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
	if probe {
		b.probing.Store(false)
	}
}

// failure records a store call that failed at now and reports whether the
// breaker opened because of it.
func (b *breaker) failure(now time.Time, probe bool) (opened bool) {
	n := b.failures.Add(1)
	if probe || (n >= b.threshold && b.openUntil.Load() == 0) {
		b.openUntil.Store(now.Add(b.cooldown).UnixNano())
		b.opens.Add(1)
		opened = true
	}
	if probe {
		b.probing.Store(false)
	}
	return opened
}

// retryIn is how long until the breaker lets a probe through, zero when it
// is closed or half-open.
func (b *breaker) retryIn(now time.Time) time.Duration {
	until := b.openUntil.Load()
	if until == 0 {
		return 0
	}
	if d := time.Duration(until - now.UnixNano()); d > 0 {
		return d
	}
	return 0
}

// isOpen reports whether the breaker is open or half-open.
func (b *breaker) isOpen() bool { return b.openUntil.Load() != 0 }

// release gives up a probe whose call ended without telling anything about
// the store (the caller went away, or the input was bad).
func (b *breaker) release(probe bool) {
	if probe {
		b.probing.Store(false)
	}
}
