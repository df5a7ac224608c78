package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// Limits of an Emergency configuration.
const (
	// MaxEmergencyPolicies bounds Emergency.Policies.
	MaxEmergencyPolicies = 256
	// DefaultEmergencyBuckets is the bucket cap of an Emergency whose
	// MaxBuckets is 0.
	DefaultEmergencyBuckets = 100_000
	// MaxEmergencyClients bounds Emergency.Clients.
	MaxEmergencyClients = 1 << 20
)

// DegradedClientLocal marks a decision this client's emergency bucket
// made while the node could not be reached.
const DegradedClientLocal = "client_local"

// Emergency configures the client's local emergency buckets (WithEmergency):
// in-process token buckets (or windows) that decide a check when the node
// cannot be reached (gRPC Unavailable, or the client's timeout), so that a
// caller keeps a bounded budget instead of admitting everything
// (UnreachableOpen) or nothing (UnreachableClosed).
//
// Each bucket is one (policy, subject), as on the node, and enforces the
// region's share f of the policy divided by Clients: capacity f·C/Clients
// and refill f·r/Clients. So the Clients clients of a region together admit
// no more while the node is down than the region's bucket would, C·f plus
// f·r per second, on top of what the node admitted before the outage.
//
// The share f is the one the node reported in its last answer naming the
// policy (PolicyDecision.Share), or EmergencyPolicy.Share until then. The
// admission API reports f and the region's capacity f·C (the deciding
// limit), not the refill, window or algorithm, so the policy's Limits come
// from the configuration; when the node's limit is below f·C of the
// configured capacity (the policy shrank), the bucket shrinks to the
// node's limit. A subject whose share the coordinator overrides is held
// to the share last reported for its policy, whichever subject that
// answer was for.
type Emergency struct {
	// Clients is the number of clients expected to share the region's
	// budget while its node is down; at least 1, at most
	// MaxEmergencyClients. Overestimating it is safe (each bucket is
	// smaller); underestimating it lets the region's clients together
	// exceed its share.
	Clients int
	// Policies are the policies decided locally; 1 to
	// MaxEmergencyPolicies, each named once. A check naming a policy not
	// listed falls back to the unreachable mode (WithUnreachable).
	Policies []EmergencyPolicy
	// MaxBuckets caps the local buckets; 0 means DefaultEmergencyBuckets.
	// A check that needs a new bucket at the cap, with no expired bucket
	// to reuse, falls back to the unreachable mode.
	MaxBuckets int
	// Clock tells the buckets the time; nil means the system's clock.
	Clock bucket.Clock
}

// EmergencyPolicy is one policy of an Emergency configuration.
type EmergencyPolicy struct {
	// Name is the policy's name, as in checks.
	Name string
	// Limits are the policy's global limits as its policy file states
	// them (capacity, refill or window, algorithm, overcommit). A zero
	// IdleTTL means the shortest valid one: a full refill, or the window
	// (two for sliding windows), and at least a minute.
	Limits bucket.Limits
	// Share is the region's share to assume until the node has answered
	// a check of the policy, in [0, 1+Overcommit]. Zero means unknown:
	// until then the unreachable mode decides.
	Share float64
}

// minEmergencyTTL is the shortest default idle TTL, as a policy file's.
const minEmergencyTTL = time.Minute

// emergency holds the local buckets of an Emergency configuration.
type emergency struct {
	clients  float64
	store    *bucket.Memory              // reads Emergency.Clock
	policies map[string]*emergencyPolicy // read-only after newEmergency
	// retryAfter is the RetryAfter of a denial for want of any share
	// (WithUnreachableRetryAfter).
	retryAfter time.Duration
	// salt hashes raw subjects (Request.HashSubject) for the local
	// buckets only: random per client, never sent anywhere.
	salt string
}

// emergencyPolicy is one policy's limits and what the node last said of
// its share in this region.
type emergencyPolicy struct {
	limits bucket.Limits
	mu     sync.Mutex
	known  bool    // share is set (configured, or reported by the node)
	share  float64 // the region's share f
	limit  int64   // the node's last reported region capacity, floor(f·C); -1: none
}

func newEmergency(e *Emergency, retryAfter time.Duration) (*emergency, error) {
	if e.Clients < 1 || e.Clients > MaxEmergencyClients {
		return nil, fmt.Errorf("%w: emergency clients %d, want 1 to %d", ErrInvalidConfig, e.Clients, MaxEmergencyClients)
	}
	if len(e.Policies) == 0 || len(e.Policies) > MaxEmergencyPolicies {
		return nil, fmt.Errorf("%w: %d emergency policies, want 1 to %d", ErrInvalidConfig, len(e.Policies), MaxEmergencyPolicies)
	}
	if e.MaxBuckets < 0 {
		return nil, fmt.Errorf("%w: emergency MaxBuckets %d is negative", ErrInvalidConfig, e.MaxBuckets)
	}
	maxBuckets := e.MaxBuckets
	if maxBuckets == 0 {
		maxBuckets = DefaultEmergencyBuckets
	}
	store, err := bucket.NewMemory(bucket.MemoryConfig{Clock: e.Clock, MaxBuckets: maxBuckets})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var salt [16]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return nil, fmt.Errorf("client: emergency subject salt: %w", err)
	}
	em := &emergency{clients: float64(e.Clients), store: store, retryAfter: retryAfter,
		policies: make(map[string]*emergencyPolicy, len(e.Policies)), salt: hex.EncodeToString(salt[:])}
	for i, p := range e.Policies {
		if _, err := bucket.NewKey(p.Name, 0, "probe"); err != nil {
			return nil, fmt.Errorf("%w: emergency policy %d: %w", ErrInvalidConfig, i, err)
		}
		if _, dup := em.policies[p.Name]; dup {
			return nil, fmt.Errorf("%w: emergency policy %q named twice", ErrInvalidConfig, p.Name)
		}
		l := p.Limits
		if l.IdleTTL == 0 {
			l.IdleTTL = shortestTTL(l)
		}
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("%w: emergency policy %q: %w", ErrInvalidConfig, p.Name, err)
		}
		if math.IsNaN(p.Share) || p.Share < 0 || p.Share > 1+l.Overcommit {
			return nil, fmt.Errorf("%w: emergency policy %q: share %v outside [0, %g]", ErrInvalidConfig, p.Name, p.Share, 1+l.Overcommit)
		}
		em.policies[p.Name] = &emergencyPolicy{limits: l, known: p.Share > 0, share: p.Share, limit: -1}
	}
	return em, nil
}

// shortestTTL is the shortest idle TTL Limits.Validate accepts for l, at
// least minEmergencyTTL; l.Validate reports limits it cannot help.
func shortestTTL(l bucket.Limits) time.Duration {
	need := l.Window
	switch l.Algorithm {
	case "", bucket.TokenBucket:
		need = 0
		if l.RefillPerSecond > 0 {
			need = time.Duration(math.Ceil(float64(l.Capacity)/l.RefillPerSecond)) * time.Second
		}
	case bucket.SlidingWindow:
		need = 2 * l.Window
	}
	return min(max(need, minEmergencyTTL), bucket.MaxIdleTTL)
}

// learn records the shares and limits of a node's answer.
func (em *emergency) learn(ps []PolicyDecision) {
	for i := range ps {
		ep := em.policies[ps[i].Policy]
		if ep == nil {
			continue
		}
		ep.mu.Lock()
		ep.known, ep.share, ep.limit = true, ps[i].Share, ps[i].Limit
		ep.mu.Unlock()
	}
}

// clientShare is the share f_c of the policy's budget one client's bucket
// enforces: the region's share over the clients, scaled down to the
// node's limit when that is below the configured capacity's (the policy
// shrank), at most 1+ε. ok is false while the share is unknown.
func (ep *emergencyPolicy) clientShare(clients float64) (f float64, ok bool) {
	ep.mu.Lock()
	known, share, limit := ep.known, ep.share, ep.limit
	ep.mu.Unlock()
	if !known {
		return 0, false
	}
	c := float64(ep.limits.Capacity)
	if limit >= 0 && float64(limit) < math.Floor(share*c) {
		share = float64(limit) / c
	}
	return min(share, 1+ep.limits.Overcommit) / clients, true
}

// errNoLocal says why the emergency buckets could not decide a check: the
// unreachable mode then applies.
var errNoLocal = errors.New("client: no emergency bucket decision")

// decide charges req against the local buckets at the clock's now, all or
// nothing across its policies. It fails with errNoLocal (wrapped) when a
// policy has no emergency bucket or no known share, or the buckets are at
// their cap; with ErrInvalidRequest when the node would refuse req too.
func (em *emergency) decide(req *Request) (Decision, error) {
	subject := req.Subject
	if req.HashSubject {
		subject = bucket.HashSubject(em.salt, subject)
	}
	cost := req.Cost
	if cost == 0 {
		cost = 1
	}
	if req.Peek {
		cost = 0
	}
	var reqs [MaxPolicies]bucket.Request
	shares := make([]float64, len(req.Policies))
	for i, name := range req.Policies {
		ep := em.policies[name]
		if ep == nil {
			return Decision{}, fmt.Errorf("%w: policy %q has none", errNoLocal, name)
		}
		f, ok := ep.clientShare(em.clients)
		if !ok {
			return Decision{}, fmt.Errorf("%w: the region's share of policy %q is not known yet", errNoLocal, name)
		}
		key, err := bucket.NewKey(name, 0, subject)
		if err != nil {
			return Decision{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		shares[i] = f
		reqs[i] = bucket.Request{Key: key, Limits: ep.limits, Share: f, Cost: cost}
	}
	if i := zeroShare(shares); i >= 0 {
		// The region holds no share: its node denies everything.
		return em.noShare(req, shares, i), nil
	}
	ds, err := em.store.TakeAll(context.Background(), reqs[:len(req.Policies)])
	switch {
	case errors.Is(err, bucket.ErrMemoryFull):
		return Decision{}, fmt.Errorf("%w: %w", errNoLocal, err)
	case err != nil:
		return Decision{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	// TakeAllAt reports Allowed false for every bucket of a denied
	// check; the buckets that blocked it carry a RetryAfter.
	out := Decision{Allowed: true, Degraded: DegradedClientLocal, Policies: make([]PolicyDecision, len(ds))}
	decider := -1
	for i, d := range ds {
		own := d.Allowed || d.RetryAfter == 0
		out.Policies[i] = PolicyDecision{Policy: req.Policies[i], Allowed: own, Limit: int64(d.Limit), Remaining: int64(d.Remaining),
			RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter, Share: shares[i]}
		switch {
		case !own && out.Allowed:
			out.Allowed, decider = false, i
		case out.Allowed && (decider < 0 || d.Remaining < ds[decider].Remaining):
			decider = i
		}
	}
	pd := out.Policies[decider]
	out.DecidedBy, out.Limit, out.Remaining, out.RetryAfter, out.ResetAfter = pd.Policy, pd.Limit, pd.Remaining, pd.RetryAfter, pd.ResetAfter
	return out, nil
}

// zeroShare returns the index of the first share that is not positive, or
// -1.
func zeroShare(shares []float64) int {
	for i, f := range shares {
		if !(f > 0) {
			return i
		}
	}
	return -1
}

// noShare is the denial of a check one of whose policies has no share in
// the region: nothing is charged, and the policy without share decides.
func (em *emergency) noShare(req *Request, shares []float64, decider int) Decision {
	out := Decision{Degraded: DegradedClientLocal, DecidedBy: req.Policies[decider], RetryAfter: em.retryAfter,
		Policies: make([]PolicyDecision, len(shares))}
	for i, f := range shares {
		out.Policies[i] = PolicyDecision{Policy: req.Policies[i], Allowed: f > 0, Share: f}
	}
	out.Policies[decider].RetryAfter = em.retryAfter
	return out
}
