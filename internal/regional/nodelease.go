package regional

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// Node leases: a node that sees a subject of a leasable policy (one with
// policy.NodeLease set) checked more than HotChecks times in a second
// leases part of the region's bucket for that subject (bucket.Leaser: one
// atomic store call carves a rate and a burst out until an end) and then
// decides the subject's checks in memory, from a token bucket of the
// lease's rate and burst (bucket.State, the same maths as the store's),
// until the lease ends. The lease is renewed halfway through its TTL by
// the check that finds it due, released when the subject has been idle
// for a TTL, and dropped (the checks go to the store again) when it ends
// unrenewed, when the store fails, or when the subject's share, limits or
// key change. Every decision made from a lease is one the region's bucket
// could have made (the bucket's doc in package bucket proves the sum of
// leases and store-backed checks stays within the region's bucket), so the
// bound between regions is unchanged. docs/rlqs.md, "Node leases".
//
// Safety of the node's own timing: a lease is used until the check's
// clock reading before the lease call plus its TTL, never later than the
// store's end (the store starts the TTL when the call reaches it), so the
// node needs its clock's rate, not its offset, to agree with the store's.

// Node lease defaults (Config.NodeLeaseHot, NodeLeaseMax,
// NodeLeaseMaxPerPolicy).
const (
	DefaultNodeLeaseHot          = 20
	DefaultNodeLeaseMax          = 1024
	DefaultNodeLeaseMaxPerPolicy = 256
	// maxHeat bounds the subjects whose checks are counted within one
	// second to find the hot ones; more are not counted that second.
	maxHeat = 4096
	// leaseRetry is how long after a failed lease call the subject is
	// not tried again (its checks go to the store meanwhile).
	leaseRetry = 100 * time.Millisecond
)

// nodeLeases is one node's lease cache. Safe for concurrent use.
type nodeLeases struct {
	n         *Node
	store     bucket.Leaser
	holder    string
	hot       int64
	maxLeases int
	maxPolicy int

	mu        sync.RWMutex
	leased    map[bucket.Key]*nodeLease
	perPolicy map[string]int

	heatMu  sync.Mutex
	heatSec int64 // the Unix second the counts are of
	heat    map[bucket.Key]*heat
}

// heat counts one subject's checks within the current second.
type heat struct {
	checks, cost int64
	retryAt      time.Time
	// tokens is what the region's bucket held at the last failed grant:
	// the next asks no larger a burst.
	tokens float64
}

// nodeLease is one live lease of this node and the bucket it decides from.
type nodeLease struct {
	req     bucket.Request // the request the lease was taken with (cost 0)
	policy  string
	subject string
	ttl     time.Duration

	mu    sync.Mutex
	dead  bool // released or ended: no decision may use it
	st    bucket.State
	prep  bucket.Prepared
	rate  float64
	burst int64
	// most and mostBurst are the largest rate and burst the node's part
	// of the share allows.
	most, mostBurst float64
	end             time.Time // the node's clock: no decision at or after it
	renewing        bool
	retryAt         time.Time // no renewal before (the last one failed)
	lastUse         time.Time
	// asked is the cost checks asked of the lease (admitted or not)
	// since the lease was taken or last renewed, at since: the subject's
	// rate here, which a renewal sizes the lease from.
	asked int64
	since time.Time
}

// newNodeLeases returns the lease cache of n over store, or nil when the
// store cannot lease.
func newNodeLeases(n *Node, store bucket.Store) *nodeLeases {
	leaser, ok := store.(bucket.Leaser)
	if !ok {
		return nil
	}
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	region := n.cfg.Region
	if len(region) > 32 {
		region = region[:32]
	}
	return &nodeLeases{n: n, store: leaser, holder: "node." + region + "." + hex.EncodeToString(nonce[:]),
		hot: int64(n.cfg.NodeLeaseHot), maxLeases: n.cfg.NodeLeaseMax, maxPolicy: n.cfg.NodeLeaseMaxPerPolicy,
		leased: make(map[bucket.Key]*nodeLease), perPolicy: make(map[string]int), heat: make(map[bucket.Key]*heat)}
}

// decide decides items[enforce] all or nothing from this node's leases
// when every one of them is leased and live, and returns ok false
// (deciding nothing) otherwise: the check then goes to the store. It
// counts the checks of unleased subjects of leasable policies and takes a
// lease for one that turns hot (a store call made by this check).
func (l *nodeLeases) decide(ctx context.Context, now time.Time, items []item, enforce []int) (decs []bucket.Decision, allowed, ok bool) {
	for _, i := range enforce {
		if p := items[i].pol; p == nil || p.Lease == nil {
			return nil, false, false
		}
	}
	leases := make([]*nodeLease, len(enforce))
	missing := false
	l.mu.RLock()
	for j, i := range enforce {
		leases[j] = l.leased[items[i].req.Key]
		missing = missing || leases[j] == nil
	}
	l.mu.RUnlock()
	if missing {
		// This check goes to the store; a lease taken now serves the next.
		for j, i := range enforce {
			if leases[j] == nil {
				l.observe(ctx, &items[i], now)
			}
		}
		return nil, false, false
	}
	for j, i := range enforce {
		it, e := &items[i], leases[j]
		if e.req.Key != it.req.Key || e.req.Share != it.req.Share || e.req.Limits != it.req.Limits || !e.req.Since.Equal(it.req.Since) {
			// The share, the limits or the key version changed: the lease
			// was sized for another bucket.
			l.release(ctx, e, now)
			return nil, false, false
		}
		for _, k := range enforce[:j] {
			if items[k].req.Key == it.req.Key {
				return nil, false, false // a repeated bucket: the store merges it
			}
		}
	}
	// Lock the leases in one order (by policy) so that two checks never
	// wait on each other.
	order := make([]int, len(enforce))
	for j := range order {
		order[j] = j
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(leases[a].policy, leases[b].policy) })
	for _, j := range order {
		leases[j].mu.Lock()
	}
	unlock := func() {
		for _, j := range order {
			leases[j].mu.Unlock()
		}
	}
	var ended []*nodeLease
	for j, i := range enforce {
		e := leases[j]
		if e.dead || !now.Before(e.end) {
			ended = append(ended, e)
		} else if items[i].req.Cost > e.burst {
			unlock()
			return nil, false, false // more than the lease could ever hold
		}
	}
	if len(ended) > 0 {
		unlock()
		for _, e := range ended {
			l.release(ctx, e, now)
		}
		return nil, false, false
	}
	decs = make([]bucket.Decision, len(enforce))
	allowed = true
	for j, i := range enforce {
		e := leases[j]
		d, err := e.st.TakeAt(now, &e.prep, 1, 0)
		if err != nil {
			unlock()
			return nil, false, false
		}
		decs[j] = d
		allowed = allowed && d.Remaining >= float64(items[i].req.Cost)
	}
	var due []*nodeLease
	for j, i := range enforce {
		e, cost := leases[j], items[i].req.Cost
		e.lastUse = now
		e.asked += cost
		if cost > 0 && (allowed || decs[j].Remaining < float64(cost)) {
			// Charged when the whole check is admitted; asked (and denied
			// without a charge) when it is the bucket that blocks.
			decs[j], _ = e.st.TakeAt(now, &e.prep, 1, cost)
		}
		decs[j].Allowed = allowed || decs[j].Remaining >= float64(cost)
		decs[j].Limit = items[i].limit()
		if !e.renewing && !now.Before(e.retryAt) && (!now.Before(e.end.Add(-e.ttl/2)) || e.outgrown(now)) {
			e.renewing = true
			due = append(due, e)
		}
	}
	unlock()
	for _, e := range due {
		l.renew(ctx, e, now)
	}
	return decs, allowed, true
}

// observe counts a check of it, whose subject holds no lease on this
// node, and takes a lease when the subject is hot; it reports whether it
// did.
func (l *nodeLeases) observe(ctx context.Context, it *item, now time.Time) bool {
	sec := now.Unix()
	l.heatMu.Lock()
	roll := sec != l.heatSec
	if roll {
		l.heatSec = sec
		clear(l.heat)
	}
	h := l.heat[it.req.Key]
	if h == nil && len(l.heat) < maxHeat {
		h = &heat{tokens: math.Inf(1)}
		l.heat[it.req.Key] = h
	}
	take := false
	if h != nil {
		h.checks++
		h.cost += it.req.Cost
		take = h.checks > l.hot && !now.Before(h.retryAt)
		if take {
			h.retryAt = now.Add(leaseRetry) // one caller at a time takes it
		}
	}
	l.heatMu.Unlock()
	if roll {
		for _, e := range l.idle(now) {
			l.release(ctx, e, now)
		}
	}
	if !take {
		return false
	}
	return l.acquire(ctx, it, now, h)
}

// idle returns the leases not used for a TTL, or ended.
func (l *nodeLeases) idle(now time.Time) []*nodeLease {
	l.mu.RLock()
	var idle []*nodeLease
	for _, e := range l.leased {
		e.mu.Lock()
		if now.Sub(e.lastUse) >= e.ttl || !now.Before(e.end) {
			idle = append(idle, e)
		}
		e.mu.Unlock()
	}
	l.mu.RUnlock()
	return idle
}

// acquire takes a lease for it's subject, sized from the checks counted
// in h, and installs it; it reports whether it did.
func (l *nodeLeases) acquire(ctx context.Context, it *item, now time.Time, h *heat) bool {
	p := it.pol
	l.mu.RLock()
	full := len(l.leased) >= l.maxLeases || l.perPolicy[p.Name] >= l.maxPolicy
	held := l.leased[it.req.Key] != nil
	l.mu.RUnlock()
	if held {
		return false
	}
	if full {
		// Room comes only from leases that ended or went idle.
		for _, e := range l.idle(now) {
			l.release(ctx, e, now)
		}
		l.mu.RLock()
		full = len(l.leased) >= l.maxLeases || l.perPolicy[p.Name] >= l.maxPolicy
		l.mu.RUnlock()
		if full {
			return false
		}
	}
	part := l.part(it.req.Share, p.Name, p.Lease.Fraction, it.subject)
	l.heatMu.Lock()
	counted, tokens := float64(h.cost), h.tokens
	l.heatMu.Unlock()
	// Twice the subject's rate here (the cost counted this second over
	// the part of the second gone), within the node's part of the refill.
	gone := max(now.Sub(now.Truncate(time.Second)), 50*time.Millisecond)
	rate := l.size(part*p.Limits.RefillPerSecond, counted/gone.Seconds())
	// No larger a burst than the bucket held at the last refusal.
	burst := int64(math.Floor(min(float64(burstFor(rate, part*float64(p.Limits.Capacity))), tokens)))
	if burst < 1 && it.req.Share*float64(p.Limits.Capacity) >= 1 {
		burst = 1
	}
	req := it.req
	req.Cost = 0
	q := bucket.LeaseRequest{Request: req, Holder: l.holder, Rate: rate, Burst: burst, For: p.Lease.TTL}
	q.Request.Withheld = l.n.withheld(it)
	if q.Validate() != nil {
		return false // a share too small to lease: the store decides
	}
	cctx, cancel := context.WithTimeout(ctx, l.n.cfg.StoreTimeout)
	ls, err := l.store.Lease(cctx, q)
	cancel()
	l.n.m.nodeLeaseCalls.WithLabelValues("grant").Inc()
	if err != nil || !ls.Granted {
		if err == nil {
			l.heatMu.Lock()
			h.tokens = ls.Tokens
			l.heatMu.Unlock()
		}
		return false
	}
	e := &nodeLease{req: req, policy: p.Name, subject: it.subject, ttl: p.Lease.TTL, end: now.Add(p.Lease.TTL),
		lastUse: now, since: now, most: part * p.Limits.RefillPerSecond, mostBurst: part * float64(p.Limits.Capacity)}
	if !e.fill(ls) {
		l.releaseLease(ctx, e, 0, now)
		return false
	}
	l.mu.Lock()
	if l.leased[it.req.Key] != nil {
		l.mu.Unlock()
		l.releaseLease(ctx, e, ls.Burst, now)
		return false
	}
	l.leased[it.req.Key] = e
	l.perPolicy[p.Name]++
	l.n.m.nodeLeases.Set(float64(len(l.leased)))
	l.mu.Unlock()
	return true
}

// RegionDemandParts is a ShareSource that knows how the region's demand
// for a subject is split among its nodes (internal/regionsync's
// DemandPart, from the nodes' demand reports in etcd).
type RegionDemandParts interface {
	DemandPart(policy, subject string) (part float64, ok bool)
}

// part is this node's part of the region's bucket for a subject of a
// leased policy at share: share × fraction × demandPart.
func (l *nodeLeases) part(share float64, policyName string, fraction float64, subject string) float64 {
	return share * fraction * l.n.demandPart(policyName, subject)
}

// demandPart is this node's part of its region's bucket for a policy's
// subject, in (0, 1]: split among the region's nodes by their demand for
// the subject when the shares source knows it (RegionDemandParts), else
// evenly; a node keeps at least half its even part, as its demand may
// have grown since its last report. Node leases and RLQS assignments
// (rlqs.Config.Part) take this part. The parts are what each node asks
// for, not a bound: the region's bucket never leases more than its refill
// in total, so parts summing past 1 (stale reports) only leave a node's
// ask partly granted.
func (n *Node) demandPart(policyName, subject string) float64 {
	nodes := 1
	if n.nodes != nil {
		nodes = max(1, n.nodes.Nodes())
	}
	w := 1 / float64(nodes)
	if dp, ok := n.nodes.(RegionDemandParts); ok && nodes > 1 {
		if d, ok := dp.DemandPart(policyName, subject); ok {
			w = max(d, w/2)
		}
	}
	return w
}

// outgrown reports whether the subject asks e for more than 80% of its
// rate (a lease is sized at twice what its subject asks), measured over at least leaseRetry, while the node's part allows
// more: the lease is then resized at once rather than at half its TTL (a
// subject decided in memory is often checked faster than it was through
// the store). e.mu is held.
func (e *nodeLease) outgrown(now time.Time) bool {
	el := now.Sub(e.since)
	return e.rate < e.most && el >= leaseRetry && float64(e.asked) > 0.8*e.rate*el.Seconds()
}

// size returns the rate to lease for a subject asking observed tokens
// per second here: twice that (room to grow until the next renewal), at
// least the hot rate, at most most.
func (l *nodeLeases) size(most, observed float64) float64 {
	return min(most, max(2*observed, float64(l.hot)))
}

// burstFor is the burst of a lease at rate: what half a second at the
// rate needs (the region's bucket must hold it to fund the lease, and
// what the bucket holds beyond it stays with the other nodes), at most
// most, at least 1.
func burstFor(rate, most float64) int64 {
	return max(1, int64(min(most, math.Ceil(rate/2))))
}

// fill resets e's bucket to a full lease ls; false: ls cannot be held in
// a bucket (a rate too small for package bucket's limits).
func (e *nodeLease) fill(ls bucket.Lease) bool {
	full := time.Duration(math.Ceil(float64(ls.Burst)/ls.Rate*1e3)) * time.Millisecond
	prep, err := bucket.Prepare(bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: ls.Burst,
		RefillPerSecond: ls.Rate, IdleTTL: max(full, time.Second) + e.ttl + time.Minute})
	if err != nil {
		return false
	}
	e.prep, e.st, e.rate, e.burst = prep, bucket.State{}, ls.Rate, ls.Burst
	return true
}

// renew extends e for another TTL from now (the check's clock reading,
// before the call). A renewal keeps e's tokens; a fresh grant (the store
// could not renew the same rate and burst) starts e full at the new
// lease, less what e spent while the call was out (the old lease ended
// when the call reached the store). A failed call leaves e to its end.
func (l *nodeLeases) renew(ctx context.Context, e *nodeLease, now time.Time) {
	e.mu.Lock()
	q := bucket.LeaseRequest{Request: e.req, Holder: l.holder, Rate: e.rate, Burst: e.burst, For: e.ttl, Renew: true}
	if p, ok := l.n.Policies().Get(e.policy); ok && p.Lease != nil {
		// The node's part follows the region's demand: a renewal may
		// grow or shrink the lease to it.
		part := l.part(e.req.Share, e.policy, p.Lease.Fraction, e.subject)
		e.most, e.mostBurst = part*e.req.Limits.RefillPerSecond, part*float64(e.req.Limits.Capacity)
	}
	if el := now.Sub(e.since); el > 0 {
		// A rate more than 20% off what the subject asks is resized (a
		// fresh lease, which takes its burst again).
		if want := l.size(e.most, float64(e.asked)/el.Seconds()); math.Abs(want-e.rate) > 0.2*e.rate {
			q.Rate, q.Burst = want, burstFor(want, e.mostBurst)
		}
	}
	e.asked, e.since = 0, now
	before, _ := e.st.TakeAt(now, &e.prep, 1, 0)
	e.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, l.n.cfg.StoreTimeout)
	ls, err := l.store.Lease(cctx, q)
	cancel()
	l.n.m.nodeLeaseCalls.WithLabelValues("renew").Inc()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.renewing = false
	if err != nil || !ls.Granted || e.dead {
		e.retryAt = now.Add(leaseRetry)
		return
	}
	if !ls.Renewed {
		after, _ := e.st.TakeAt(now, &e.prep, 1, 0)
		spent := int64(math.Ceil(max(0, before.Remaining-after.Remaining)))
		if !e.fill(ls) {
			e.dead = true
			return
		}
		if spent > 0 {
			_, _ = e.st.TakeAt(now, &e.prep, 1, min(spent, e.burst))
		}
	}
	e.end = now.Add(e.ttl)
}

// release unlinks e, marks it dead and gives its unspent whole tokens
// back to the region's bucket (the lease ends at once: no decision uses
// it after this). An ended lease is only unlinked.
func (l *nodeLeases) release(ctx context.Context, e *nodeLease, now time.Time) {
	l.mu.Lock()
	if l.leased[e.req.Key] == e {
		delete(l.leased, e.req.Key)
		l.perPolicy[e.policy]--
		if l.perPolicy[e.policy] <= 0 {
			delete(l.perPolicy, e.policy)
		}
		l.n.m.nodeLeases.Set(float64(len(l.leased)))
	}
	l.mu.Unlock()
	e.mu.Lock()
	if e.dead {
		e.mu.Unlock()
		return
	}
	e.dead = true
	live := now.Before(e.end)
	var unspent int64
	if live {
		d, _ := e.st.TakeAt(now, &e.prep, 1, 0)
		unspent = int64(math.Floor(d.Remaining))
	}
	e.mu.Unlock()
	if live {
		l.releaseLease(ctx, e, unspent, now)
	}
}

// releaseLease ends e's lease in the store, giving back unspent tokens.
func (l *nodeLeases) releaseLease(ctx context.Context, e *nodeLease, unspent int64, _ time.Time) {
	req := e.req
	req.Cost, req.Withheld = 0, 0
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.n.cfg.StoreTimeout)
	_, _ = l.store.Release(cctx, bucket.LeaseRelease{Request: req, Holder: l.holder, Unspent: min(unspent, req.Limits.Capacity)})
	cancel()
	l.n.m.nodeLeaseCalls.WithLabelValues("release").Inc()
}

// refund gives cost back to the lease of key, never above its burst, and
// reports whether key is leased here (a charge decided from a lease is
// refunded into it: giving it to the region's bucket would let the bucket
// and the lease together hold more than the bucket's capacity).
func (l *nodeLeases) refund(key bucket.Key, cost int64, now time.Time) (bucket.Decision, bool) {
	l.mu.RLock()
	e := l.leased[key]
	l.mu.RUnlock()
	if e == nil {
		return bucket.Decision{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead || !now.Before(e.end) {
		// Ended: what it spent is gone with it; nothing is given back.
		return bucket.Decision{}, true
	}
	d, err := e.st.RefundAt(now, &e.prep, 1, min(cost, e.burst))
	if err != nil {
		return bucket.Decision{}, true
	}
	d.Limit = e.req.Share * float64(e.req.Limits.Capacity)
	return d, true
}

// heldAbove returns when the last lease of policy taken at a share above
// share(subject) ends (zero: none): the region's sync acknowledges a
// shrink of the policy only after then.
func (l *nodeLeases) heldAbove(policy string, share func(subject string) float64) time.Time {
	var last time.Time
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, e := range l.leased {
		if e.policy != policy {
			continue
		}
		e.mu.Lock()
		if !e.dead && e.req.Share > share(e.subject) && e.end.After(last) {
			last = e.end
		}
		e.mu.Unlock()
	}
	return last
}

// releaseLeases gives every node lease back to the store (the node stops:
// its hot subjects' budget goes back to the region's other nodes).
func (n *Node) releaseLeases() {
	if n.leases != nil {
		n.leases.closeAll(context.Background(), n.cfg.Clock.Now())
	}
}

// closeAll releases every lease.
func (l *nodeLeases) closeAll(ctx context.Context, now time.Time) {
	l.mu.RLock()
	all := make([]*nodeLease, 0, len(l.leased))
	for _, e := range l.leased {
		all = append(all, e)
	}
	l.mu.RUnlock()
	for _, e := range all {
		l.release(ctx, e, now)
	}
}
