package bucket

import (
	"context"

	"github.com/quotacoord/quota/internal/clock"
)

// SetRedisNow makes r pass now() (microseconds) to its scripts in place of
// Redis TIME. Tests only: it drives the differential test.
func SetRedisNow(r *Redis, now func() int64) { r.now = now }

// KeyWithHash returns k with its hash replaced by h, so that tests can
// make distinct keys collide in Memory's shards and index.
func KeyWithHash(k Key, h uint64) Key {
	k.hash = h
	return k
}

// RedisCrossSlot reports whether r has stopped sending keys of several
// hash slots in one script call after a CROSSSLOT refusal.
func RedisCrossSlot(r *Redis) bool { return r.crossSlot.Load() }

// GroupClusterSlot is groupClusterSlot, for a test against CLUSTER KEYSLOT.
var GroupClusterSlot = groupClusterSlot

// OwnKey is ownKey, for tests of its cost.
func OwnKey(k Key, g uint32) string { return ownKey(&k, g) }

// QueueTake queues a take of req for the flushers, as a call that finds
// others in the store does, and returns the wait for its decision.
func QueueTake(r *Redis, ctx context.Context, req Request) (func() (Decision, error), error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	ps := []params{paramsOf(&req)}
	c := r.newCall(opTake, []Request{req}, ps)
	if err := r.enqueue(ctx, c); err != nil {
		return nil, err
	}
	return func() (Decision, error) {
		if err := wait(ctx, c); err != nil {
			return Decision{}, err
		}
		d := c.decision(0)
		c.release()
		return d, nil
	}, nil
}

// LoneIdle is how long the lone connection may sit idle and still carry a
// call unchecked.
const LoneIdle = loneIdle

// SetLoneClock makes r's lone connection measure its idle time on c.
func SetLoneClock(r *Redis, c clock.Monotonic) { r.lone.clock = c }
