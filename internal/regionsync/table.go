package regionsync

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync/atomic"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// ErrBadAllocation reports an allocation this region cannot enforce as
// published.
var ErrBadAllocation = errors.New("regionsync: bad allocation")

// table is what the hot path reads. It is never modified once published.
type table struct {
	// inflight counts the checks that pinned this table (Begin) and did
	// not End yet.
	inflight atomic.Int64
	// lost: no lease, or no fresh read of the allocations under the
	// current lease; every share is the safe share.
	lost bool
	// shares are the allocations applied, and the epochs an Ack carries.
	shares sharedShares
	// lostSpans are the past periods without a lease (LowestShare).
	lostSpans []span
}

// sharedShares are the policies' shares as a region applies them, split
// by etcdlayout.PolicyShard: allocs holds each policy's shares, epochs
// the epoch of every allocation applied as published (what an Ack
// carries, shard by shard). A shard's maps are never changed once a table
// holds them: a change copies the maps of the shard it touches (set), so
// that applying one policy's allocation costs a shard's policies (about
// 1/etcdlayout.Shards of them), and the acknowledgement shards left alone
// are the same maps as before (ackChanged tells them apart at once).
type sharedShares struct {
	allocs [etcdlayout.Shards]map[string]*policyShares
	epochs [etcdlayout.Shards]map[string]uint64
	// n counts the policies.
	n int
}

// get returns policy's shares, nil when none.
func (sh *sharedShares) get(policy string) *policyShares {
	return sh.allocs[etcdlayout.PolicyShard(policy)][policy]
}

// set makes ps policy's shares (nil: none), copying the shard's maps the
// first time a batch touches them (copied records which it did).
func (sh *sharedShares) set(policy string, ps *policyShares, copied *[etcdlayout.Shards]bool) {
	i := etcdlayout.PolicyShard(policy)
	if !copied[i] {
		sh.allocs[i] = maps.Clone(sh.allocs[i])
		sh.epochs[i] = maps.Clone(sh.epochs[i])
		if sh.allocs[i] == nil {
			sh.allocs[i] = map[string]*policyShares{}
			sh.epochs[i] = map[string]uint64{}
		}
		copied[i] = true
	}
	if _, ok := sh.allocs[i][policy]; ok {
		sh.n--
	}
	delete(sh.allocs[i], policy)
	delete(sh.epochs[i], policy)
	if ps == nil {
		return
	}
	sh.n++
	sh.allocs[i][policy] = ps
	if ps.ackable {
		sh.epochs[i][policy] = ps.epoch
	}
}

// each calls fn for every policy's shares.
func (sh *sharedShares) each(fn func(policy string, ps *policyShares)) {
	for _, m := range sh.allocs {
		for p, ps := range m {
			fn(p, ps)
		}
	}
}

// policyShares is one policy's allocation as it concerns this region.
type policyShares struct {
	epoch uint64
	// valid is false for an allocation that could not be enforced as
	// published: every subject gets the safe share and epoch is the last
	// valid one (acked when ackable).
	valid    bool
	ackable  bool
	hasDef   bool
	def      float64
	hasSafe  bool
	safe     float64
	override map[string]float64
	// hist holds the versions of the policy's shares this one replaced,
	// oldest first (see LowestShare).
	hist []pastShares
}

// compile extracts this region's shares from a published allocation of
// policy.
func compile(region, policy string, raw []byte, maxOverrides int) (*policyShares, error) {
	var a etcdlayout.Allocation
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadAllocation, policy, err)
	}
	if a.Policy != policy {
		return nil, fmt.Errorf("%w %s: record names policy %q", ErrBadAllocation, policy, a.Policy)
	}
	if !finite(a.Overcommit) || a.Overcommit < 0 {
		return nil, fmt.Errorf("%w %s: overcommit %v", ErrBadAllocation, policy, a.Overcommit)
	}
	if len(a.Overrides) > maxOverrides {
		return nil, fmt.Errorf("%w %s: %d overrides, at most %d accepted", ErrBadAllocation, policy, len(a.Overrides), maxOverrides)
	}
	hi := 1 + a.Overcommit
	ps := &policyShares{epoch: a.Epoch, valid: true, ackable: true}
	if v, ok := a.Safe[region]; ok {
		if !finite(v) || v < 0 || v > 1 {
			return nil, fmt.Errorf("%w %s: safe share %v for %s", ErrBadAllocation, policy, v, region)
		}
		ps.hasSafe, ps.safe = true, v
	}
	if v, ok := a.Default[region]; ok {
		if !finite(v) || v < 0 || v > hi {
			return nil, fmt.Errorf("%w %s: default share %v for %s", ErrBadAllocation, policy, v, region)
		}
		ps.hasDef, ps.def = true, v
	}
	for subject, byRegion := range a.Overrides {
		v, ok := byRegion[region]
		if !ok {
			continue
		}
		if !finite(v) || v < 0 || v > hi {
			return nil, fmt.Errorf("%w %s: share %v for subject %q in %s", ErrBadAllocation, policy, v, subject, region)
		}
		if ps.override == nil {
			ps.override = make(map[string]float64)
		}
		ps.override[subject] = v
	}
	return ps, nil
}

// invalid returns the entry enforced for a bad allocation that replaced
// prev (nil when there was none): the safe share, prev's safe share when
// known.
func invalid(prev *policyShares) *policyShares {
	ps := &policyShares{}
	if prev != nil {
		ps.epoch, ps.ackable = prev.epoch, prev.ackable
		ps.hasSafe, ps.safe = prev.hasSafe, prev.safe
	}
	return ps
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// build makes the immutable table from the writer's state; the shard
// maps are shared, never copied (sharedShares).
func build(lost bool, shares sharedShares, lostSpans []span) *table {
	return &table{lost: lost, shares: shares, lostSpans: lostSpans}
}
