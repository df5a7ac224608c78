package invariant

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
)

// Tolerance absorbs floating-point rounding in sums of shares.
const Tolerance = 1e-9

// MaxEpochs bounds the epochs kept per policy; older ones are dropped
// (and a region whose floor is older is checked from the oldest kept).
const MaxEpochs = 4096

// maxViolations bounds the violations a History keeps.
const maxViolations = 100

// MaxDeadNodes bounds the nodes without registration a History tracks one
// by one; beyond it, their safe shares fold into their region's (a
// conservative bound: the region keeps the largest).
const MaxDeadNodes = 4096

// MaxPolicyDocs bounds the policy documents a History keeps; later ones
// are ignored.
const MaxPolicyDocs = 4096

// ErrHistory reports a record in etcd that the checker cannot read.
var ErrHistory = errors.New("invariant: unreadable history")

// Violation is one revision at which the shares a region may be enforcing
// summed above 1 + ε.
type Violation struct {
	Revision int64
	Policy   string
	// Subject is "" for the default split.
	Subject string
	Sum     float64
	Limit   float64
	// Parts maps region to the share it may have been enforcing (the
	// largest over its nodes).
	Parts map[string]float64
}

func (v Violation) String() string {
	subj := v.Subject
	if subj == "" {
		subj = "(default)"
	}
	return fmt.Sprintf("rev %d policy %s subject %s: Σ %.6f > %.6f %v", v.Revision, v.Policy, subj, v.Sum, v.Limit, v.Parts)
}

// Report summarizes a check.
type Report struct {
	// Revisions is the number of revisions checked.
	Revisions int
	// Epochs counts the allocations seen.
	Epochs int
	// Acks counts the acknowledgements seen.
	Acks int
	// MaxSum is the largest Σ seen, minus that policy's ε (so ≤ 1 means
	// the invariant held).
	MaxSum float64
	// Violations, at most 100.
	Violations []Violation
}

// OK says no violation was found.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// nodeState is one node of a region.
type nodeState struct {
	region string
	live   bool
	// regFloor is the latest epoch per policy at registration.
	regFloor map[string]uint64
	// ack is the last acknowledged epoch per policy under this
	// registration; it outlives the acknowledgement's key, which ends
	// with the registration's lease.
	ack map[string]uint64
	// deadSafe is, for a dead node, the largest safe share per policy
	// since its floor.
	deadSafe map[string]float64
}

// forgetShard drops the acknowledged epochs of the policies in one
// acknowledgement shard (etcdlayout.PolicyShard): the shard was rewritten
// or deleted.
func (r *nodeState) forgetShard(shard int) {
	maps.DeleteFunc(r.ack, func(p string, _ uint64) bool { return etcdlayout.PolicyShard(p) == shard })
}

func (r *nodeState) floor(policy string) uint64 {
	if e, ok := r.ack[policy]; ok {
		return e
	}
	return r.regFloor[policy]
}

// History is the replayed state. See the package doc.
type History struct {
	layout etcdlayout.Layout
	allocs map[string][]*etcdlayout.Allocation // sorted by epoch
	// nodes are keyed "region/node".
	nodes map[string]*nodeState
	dead  int
	// folded is, per region and policy, the largest safe share of the
	// dead nodes folded out of nodes (see MaxDeadNodes).
	folded map[string]map[string]float64
	// docs are the policy documents; policies is what they define.
	docs     map[string][]byte
	policies *policy.Set
	report   Report
}

// NewHistory returns an empty history for keys under layout.
func NewHistory(layout etcdlayout.Layout) *History {
	return &History{
		layout: layout,
		allocs: make(map[string][]*etcdlayout.Allocation),
		nodes:  make(map[string]*nodeState),
		folded: make(map[string]map[string]float64),
		docs:   make(map[string][]byte),
	}
}

// Report returns the summary so far.
func (h *History) Report() Report {
	r := h.report
	r.Violations = append([]Violation(nil), h.report.Violations...)
	return r
}

func (h *History) latest(policy string) uint64 {
	as := h.allocs[policy]
	if len(as) == 0 {
		return 0
	}
	return as[len(as)-1].Epoch
}

// Put applies a put of key with value. Keys outside alloc/, acks/,
// regions/ and policies/ are ignored. created says the key did not exist before (etcd
// Version 1), which for a registration starts a new lease.
func (h *History) Put(key string, value []byte, created bool) error {
	l := h.layout
	switch {
	case strings.HasPrefix(key, l.PoliciesPrefix()):
		name := etcdlayout.Name(l.PoliciesPrefix(), key)
		if _, ok := h.docs[name]; ok || len(h.docs) < MaxPolicyDocs {
			h.docs[name] = value
			h.loadPolicies()
		}
	case strings.HasPrefix(key, l.AllocPrefix()):
		var a etcdlayout.Allocation
		if err := json.Unmarshal(value, &a); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrHistory, key, err)
		}
		if a.Policy == "" {
			a.Policy = etcdlayout.Name(l.AllocPrefix(), key)
		}
		h.addAlloc(&a)
	case strings.HasPrefix(key, l.AcksPrefix()):
		region, node, shard, a, err := l.DecodeAck(key, value)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrHistory, err)
		}
		h.report.Acks++
		r := h.node(region, node)
		r.forgetShard(shard)
		if r.ack == nil {
			r.ack = make(map[string]uint64, len(a.Epochs))
		}
		for p, e := range a.Epochs {
			r.ack[p] = e
		}
	case strings.HasPrefix(key, l.RegionsPrefix()):
		region, node, ok := etcdlayout.NodeOf(l.RegionsPrefix(), key)
		if !ok {
			return nil
		}
		r := h.node(region, node)
		if created || !r.live {
			if !r.live && r.deadSafe != nil {
				h.dead--
			}
			r.live = true
			r.deadSafe = nil
			r.ack = nil
			r.regFloor = make(map[string]uint64, len(h.allocs))
			for p := range h.allocs {
				r.regFloor[p] = h.latest(p)
			}
		}
	}
	return nil
}

// Delete applies a delete of key (a lease expiring or a region leaving).
func (h *History) Delete(key string) {
	l := h.layout
	switch {
	case strings.HasPrefix(key, l.PoliciesPrefix()):
		delete(h.docs, etcdlayout.Name(l.PoliciesPrefix(), key))
		h.loadPolicies()
	case strings.HasPrefix(key, l.AcksPrefix()):
		// An acknowledgement shard is deleted by a new registration of its
		// node, by a leader once it keeps the node among the vanished
		// ones, or when its last policy is gone. The node still applied
		// every epoch up to the ones it acknowledged, so its floor stays;
		// a new registration starts a new one.
	case strings.HasPrefix(key, l.RegionsPrefix()):
		region, node, ok := etcdlayout.NodeOf(l.RegionsPrefix(), key)
		if !ok {
			return
		}
		r := h.node(region, node)
		if !r.live {
			return
		}
		name := r.region
		r.deadSafe = make(map[string]float64)
		for p, as := range h.allocs {
			f := r.floor(p)
			if f == 0 {
				r.deadSafe[p] = h.minShare(p, name)
			}
			for _, a := range as {
				if a.Epoch >= f {
					r.deadSafe[p] = math.Max(r.deadSafe[p], a.Safe[name])
				}
			}
		}
		r.live = false
		r.ack = nil
		if h.dead++; h.dead > MaxDeadNodes {
			h.fold()
		}
	}
}

// fold moves every dead node's safe shares into its region's folded
// maximum and forgets the node.
func (h *History) fold() {
	for k, r := range h.nodes {
		if r.live {
			continue
		}
		f := h.folded[r.region]
		if f == nil {
			f = make(map[string]float64)
			h.folded[r.region] = f
		}
		for p, v := range r.deadSafe {
			f[p] = math.Max(f[p], v)
		}
		delete(h.nodes, k)
	}
	h.dead = 0
}

// loadPolicies parses the documents in name order, skipping any that do
// not parse or repeat a policy, as the coordinator does.
func (h *History) loadPolicies() {
	names := make([]string, 0, len(h.docs))
	for n := range h.docs {
		names = append(names, n)
	}
	sort.Strings(names)
	set, _ := policy.Merge()
	for _, n := range names {
		s, err := policy.Parse(n, h.docs[n])
		if err != nil {
			continue
		}
		if merged, err := policy.Merge(set, s); err == nil {
			set = merged
		}
	}
	h.policies = set
}

// minShare is the policy's minimum share for region: what a region
// enforces for a policy before it has read any allocation of it (0 when
// no document defines the policy).
func (h *History) minShare(pol, region string) float64 {
	if h.policies == nil {
		return 0
	}
	p, ok := h.policies.Get(pol)
	if !ok {
		return 0
	}
	return p.MinShareFor(region)
}

// node returns the state of a region's node, made when new.
func (h *History) node(region, node string) *nodeState {
	k := region + "/" + node
	r, ok := h.nodes[k]
	if !ok {
		r = &nodeState{region: region}
		h.nodes[k] = r
	}
	return r
}

func (h *History) addAlloc(a *etcdlayout.Allocation) {
	h.report.Epochs++
	as := h.allocs[a.Policy]
	i := sort.Search(len(as), func(i int) bool { return as[i].Epoch >= a.Epoch })
	if i < len(as) && as[i].Epoch == a.Epoch {
		as[i] = a
	} else {
		as = append(as, nil)
		copy(as[i+1:], as[i:])
		as[i] = a
	}
	for _, r := range h.nodes {
		if r.deadSafe != nil {
			r.deadSafe[a.Policy] = math.Max(r.deadSafe[a.Policy], a.Safe[r.region])
		}
	}
	for region, f := range h.folded {
		f[a.Policy] = math.Max(f[a.Policy], a.Safe[region])
	}
	h.allocs[a.Policy] = h.prune(a.Policy, as)
}

// prune drops epochs older than every live region's floor.
func (h *History) prune(policy string, as []*etcdlayout.Allocation) []*etcdlayout.Allocation {
	minFloor := as[len(as)-1].Epoch
	for _, r := range h.nodes {
		if r.live {
			if f := r.floor(policy); f < minFloor {
				minFloor = f
			}
		}
	}
	i := sort.Search(len(as), func(i int) bool { return as[i].Epoch >= minFloor })
	if i == len(as) {
		i = len(as) - 1
	}
	if len(as)-i > MaxEpochs {
		i = len(as) - MaxEpochs
	}
	return as[i:]
}

// share is what region enforces for subject under a ("" is the default).
func share(a *etcdlayout.Allocation, subject, region string) float64 {
	if subject != "" {
		if o, ok := a.Overrides[subject]; ok {
			if s, ok := o[region]; ok {
				return s
			}
		}
	}
	if s, ok := a.Default[region]; ok {
		return s
	}
	return a.Safe[region]
}

// Check evaluates the invariant at revision rev and records violations.
func (h *History) Check(rev int64) {
	h.report.Revisions++
	policies := make([]string, 0, len(h.allocs))
	for p := range h.allocs {
		policies = append(policies, p)
	}
	sort.Strings(policies)
	names := make([]string, 0, len(h.nodes))
	for n := range h.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, p := range policies {
		as := h.allocs[p]
		if len(as) == 0 {
			continue
		}
		eps := 0.0
		subjects := map[string]bool{"": true}
		for _, a := range as {
			eps = math.Max(eps, a.Overcommit)
			for s := range a.Overrides {
				subjects[s] = true
			}
		}
		subs := make([]string, 0, len(subjects))
		for s := range subjects {
			subs = append(subs, s)
		}
		sort.Strings(subs)
		for _, s := range subs {
			// A region may enforce the largest share any of its nodes
			// may enforce: they share the region's buckets.
			parts := make(map[string]float64)
			for region, f := range h.folded {
				if v := f[p]; v > 0 {
					parts[region] = v
				}
			}
			for _, n := range names {
				r := h.nodes[n]
				var v float64
				if r.live {
					f := r.floor(p)
					if f == 0 {
						// Registered before the first epoch and not
						// acknowledged since: it may still enforce the
						// policy's minimum, which no allocation reserved.
						v = h.minShare(p, r.region)
					}
					for _, a := range as {
						if a.Epoch >= f {
							v = math.Max(v, share(a, s, r.region))
						}
					}
				} else if r.deadSafe != nil {
					v = r.deadSafe[p]
				}
				if v > parts[r.region] {
					parts[r.region] = v
				}
			}
			sum := 0.0
			for _, region := range slices.Sorted(maps.Keys(parts)) {
				sum += parts[region]
			}
			if d := sum - eps; d > h.report.MaxSum {
				h.report.MaxSum = d
			}
			if sum > 1+eps+Tolerance && len(h.report.Violations) < maxViolations {
				h.report.Violations = append(h.report.Violations, Violation{
					Revision: rev, Policy: p, Subject: s, Sum: sum, Limit: 1 + eps, Parts: parts,
				})
			}
		}
	}
}
