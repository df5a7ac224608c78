package regional

import (
	"time"

	"github.com/quotacoord/quota/internal/regionsync"
)

// ShareSource tells the share of a policy's global budget this region may
// enforce for a subject. internal/regionsync implements it from etcd;
// Standalone is the single-region answer.
type ShareSource interface {
	// Share returns the region's share f for policy and subject; the
	// bucket enforces f·C and f·r. A share ≤ 0 denies everything.
	Share(policy, subject string) float64
	// Ready reports whether shares are known (with etcd: the first
	// allocations have been read).
	Ready() bool
}

// PinnedShareSource is a ShareSource whose checks can pin the shares they
// read: internal/regionsync's Syncer, which acknowledges an epoch only once
// every check pinned to an older table has ended (rule 2 of
// docs/rebalance.md, "a region acknowledges an epoch only once every check
// uses it"). When Config.Shares implements it, every check (own API, each
// batch, each Envoy request) calls Begin once at its start, reads all its
// shares through the Pin, and calls End exactly once when its last bucket
// call returned, on every path: decision, validation error, store error or
// timeout, cancelled caller, replayed answer. Begin, Pin.Share and Pin.End
// must be allocation-free and safe for concurrent use.
type PinnedShareSource interface {
	ShareSource
	Begin() regionsync.Pin
}

// RegionNodes is a ShareSource that knows how many nodes enforce the
// region's shares together (internal/regionsync's Syncer, from the
// region's registrations in etcd). A node whose policy fails over to its
// in-process bucket (failure mode local) gives that bucket share / Nodes()
// of the budget, so that the region's nodes together hold no more than
// the region's share while they decide apart. A source without it (a node
// without etcd) is the whole region. Nodes must be cheap, at least 1, and
// safe for concurrent use.
type RegionNodes interface {
	Nodes() int
}

// ShareHistory is a ShareSource that remembers the shares its region
// enforced (internal/regionsync's Syncer). A token bucket a check creates
// (absent from the store, or idle-expired) starts with no more than the
// lowest share of the subject during the bucket's full refill time, so
// that a subject that spent its budget in another region does not find
// this region's grown share full (bucket.Request.Withheld is the share
// above it). A source without it (a node without etcd, whose share never
// changes) starts new buckets full. LowestShare must be cheap, at most the
// current share, and safe for concurrent use.
type ShareHistory interface {
	LowestShare(policy, subject string, within time.Duration) float64
}

// Standalone is the ShareSource of a node without a coordinator: every
// share is 1 and it is always ready. Its zero value is ready to use. It
// has no pins: its shares never change.
type Standalone struct{}

// Share returns 1.
func (Standalone) Share(policy, subject string) float64 { return 1 }

// Ready returns true.
func (Standalone) Ready() bool { return true }

// sharePin is one check's view of the shares: a regionsync.Pin when the
// source pins, else the source itself. It lives on the check's stack; end
// is idempotent so that a deferred end after an explicit one is harmless.
type sharePin struct {
	src    ShareSource
	pin    regionsync.Pin
	pinned bool
}

// beginShares starts one check's view of the shares. The caller must call
// end (defer it right away).
func (n *Node) beginShares() sharePin {
	if n.pins != nil {
		return sharePin{pin: n.pins.Begin(), pinned: true}
	}
	return sharePin{src: n.cfg.Shares}
}

// share is the share of policy for subject as this check sees it.
func (p *sharePin) share(policy, subject string) float64 {
	if p.pinned {
		return p.pin.Share(policy, subject)
	}
	return p.src.Share(policy, subject)
}

// end releases the pin, once.
func (p *sharePin) end() {
	if p.pinned {
		p.pinned = false
		p.pin.End()
	}
}

// DemandSink receives one record per decided policy of a check: the cost
// offered, whether it was admitted, and whether the subject is pressured
// (denied, or left with less than half of the local capacity).
// internal/demand implements it. Record must be cheap and safe for
// concurrent use.
type DemandSink interface {
	Record(policy, subject string, cost int64, admitted bool, pressured bool)
}
