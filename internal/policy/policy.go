package policy

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// FailureMode says what a regional node does for a policy when its store
// (Redis) errors or exceeds its time budget.
type FailureMode string

const (
	// FailOpen admits, counted and logged.
	FailOpen FailureMode = "open"
	// FailClosed denies with rate-limited semantics.
	FailClosed FailureMode = "closed"
	// FailLocal decides from an in-process bucket at the region's share,
	// scaled by LocalScale.
	FailLocal FailureMode = "local"
)

// DefaultFailureMode is the failure mode of a policy that names none.
const DefaultFailureMode = FailLocal

// Policy is one validated policy in normalized form, whichever file format
// it came from.
type Policy struct {
	// Name is unique within a Set, [A-Za-z0-9_.-]{1,64}.
	Name string
	// Version is part of every bucket key: raising it starts new buckets
	// under new keys (which a regional node starts spent for a refill
	// time, see KeyVersion).
	Version uint32
	// Subject names the identity the policy limits (tenant, account,
	// api_key, ip, or an Envoy descriptor path), for documentation and
	// for callers that map requests to subjects.
	Subject string
	// HashSubject says subjects are untrusted and hashed before use.
	HashSubject bool
	// Limits are the global limits (capacity, refill, window, idle TTL,
	// algorithm, overcommit).
	Limits bucket.Limits
	// FailureMode applies when the store fails.
	FailureMode FailureMode
	// LocalScale scales the emergency local bucket (FailLocal), in (0, 1].
	LocalScale float64
	// MinShare maps region to its guaranteed minimum share; DefaultMinShare
	// applies to regions not listed.
	MinShare        map[string]float64
	DefaultMinShare float64
	// Unlimited admits everything without touching a bucket (Envoy's
	// unlimited).
	Unlimited bool
	// Shadow decides and counts but always admits (Envoy's shadow_mode).
	Shadow bool
	// Lease, when set, lets a regional node decide this policy's hot
	// subjects in memory from node leases carved out of the region's
	// bucket (token buckets only); nil: every check goes to the store.
	Lease *NodeLease

	// Description is free text for operators.
	Description string
	// Source is the file the policy was read from.
	Source string
	// Envoy is set for policies derived from an Envoy rate limit service
	// configuration file; nil for the project's own format.
	Envoy *EnvoyRule
}

// EnvoyRule says where an Envoy-derived policy came from.
type EnvoyRule struct {
	// Domain is the configuration file's domain.
	Domain string
	// Path is the descriptor path from the domain to the rule, levels
	// joined by ".", each "key" or "key_value" as in the file.
	Path string
	// Keys are the descriptor keys of the path's levels, in order.
	Keys []string
	// Unit is the rate_limit unit in lower case ("second", "minute", ...);
	// empty for unlimited rules.
	Unit string
	// RequestsPerUnit is rate_limit.requests_per_unit.
	RequestsPerUnit uint32
	// LimitName is rate_limit.name, the name other rules' replaces refer to.
	LimitName string
	// Replaces lists the limit names this rule removes when both match in
	// one request.
	Replaces []string
}

// MinShareFor returns region's guaranteed minimum share.
func (p *Policy) MinShareFor(region string) float64 {
	if m, ok := p.MinShare[region]; ok {
		return m
	}
	return p.DefaultMinShare
}

// KeyVersion returns the version used in bucket keys. It mixes Version with
// the limits that give stored bucket state its meaning (algorithm,
// capacity, refill, window, shards when above 1), so raising the version or changing those
// limits starts new buckets under new keys while the old keys expire by
// their TTL. Idle TTL, overcommit and failure settings do not change it.
// A regional node that sees the key version change starts the buckets it
// finds absent under the new key as spent at that instant for a refill
// time (bucket.Request.Since): a subject may have spent its budget under
// the old key, and an edit must not hand every region a fresh one.
func (p *Policy) KeyVersion() uint32 {
	h := fnv.New32a()
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], p.Version)
	h.Write(b[:4])
	h.Write([]byte(p.Limits.Algorithm))
	h.Write([]byte{0})
	binary.BigEndian.PutUint64(b[:], uint64(p.Limits.Capacity))
	h.Write(b[:])
	binary.BigEndian.PutUint64(b[:], math.Float64bits(p.Limits.RefillPerSecond))
	h.Write(b[:])
	binary.BigEndian.PutUint64(b[:], uint64(p.Limits.Window))
	h.Write(b[:])
	if p.Limits.Shards > 1 {
		// Another split puts a subject's budget in other sub-buckets:
		// they start spent, like any other change of the limits.
		binary.BigEndian.PutUint64(b[:], uint64(p.Limits.Shards))
		h.Write(b[:])
	}
	return h.Sum32()
}

// Bounds on policy values, so that every derived quantity (full refill
// time, TTLs, Redis arguments) stays finite and representable.
const (
	// MaxCapacity is the bucket engine's own bound, so a policy that loads
	// is one the store accepts.
	MaxCapacity = bucket.MaxCapacity
	// MaxWindow is the longest window or idle TTL.
	MaxWindow = 400 * 24 * time.Hour
	// MinWindow is the shortest window.
	MinWindow = time.Millisecond
	// MinIdleTTL is the shortest idle TTL; defaults are never shorter.
	MinIdleTTL = time.Minute
)

// Validate checks p's fields and reports the first problem as
// "field: reason". Parse and Load call it for every policy; callers that
// build policies by hand should too.
func (p *Policy) Validate() error {
	if err := validateName(p.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	switch p.FailureMode {
	case FailOpen, FailClosed, FailLocal:
	default:
		return fmt.Errorf("failure_mode: %q is not open, closed or local", p.FailureMode)
	}
	if !(p.LocalScale > 0 && p.LocalScale <= 1) {
		return fmt.Errorf("local_scale: %v must be in (0, 1]", p.LocalScale)
	}
	if err := validateShare("min_share.default", p.DefaultMinShare); err != nil {
		return err
	}
	sum := 0.0
	for region, m := range p.MinShare {
		if err := validateRegion(region); err != nil {
			return fmt.Errorf("min_share: %w", err)
		}
		if err := validateShare("min_share."+region, m); err != nil {
			return err
		}
		sum += m
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("min_share: regional minimums add up to %v, more than 1", sum)
	}
	if p.Unlimited {
		if p.Lease != nil {
			return fmt.Errorf("lease: must not be set for an unlimited policy")
		}
		return nil
	}
	if err := validateLimits(p.Limits); err != nil {
		return err
	}
	return p.Lease.validate(p.Limits)
}

// NodeLease is the node-lease setting of a policy: a regional node that
// sees a subject hot leases at most Fraction of its part of the region's
// bucket (the region's share divided among the region's nodes), for TTL
// at a time, and decides that subject's checks in memory while the lease
// lives (docs/rlqs.md, "Node leases").
type NodeLease struct {
	// Fraction is the part of the node's part of the region's rate and
	// capacity a lease may take, in (0, 1].
	Fraction float64
	// TTL is how long one lease lasts, at most the idle TTL less a full
	// refill (bucket.MaxLeaseFor); the node renews it halfway.
	TTL time.Duration
}

// MinNodeLeaseTTL is the shortest node lease: a lease renewed every few
// milliseconds would cost more store calls than it saves.
const MinNodeLeaseTTL = 100 * time.Millisecond

// validate checks l against the policy's limits; a nil l is valid.
func (l *NodeLease) validate(lim bucket.Limits) error {
	if l == nil {
		return nil
	}
	if a := lim.Algorithm; a != "" && a != bucket.TokenBucket {
		return fmt.Errorf("lease: only token buckets can be leased, not %s", a)
	}
	if lim.Shards > 1 {
		return fmt.Errorf("lease: a policy split into %d shards cannot be leased", lim.Shards)
	}
	if !(l.Fraction > 0 && l.Fraction <= 1) {
		return fmt.Errorf("lease.fraction: %v must be in (0, 1]", l.Fraction)
	}
	if most := bucket.MaxLeaseFor(lim); l.TTL < MinNodeLeaseTTL || l.TTL > most {
		return fmt.Errorf("lease.ttl: %v outside %v..%v (the idle TTL less a full refill; raise idle_ttl for longer leases)", l.TTL, MinNodeLeaseTTL, most)
	}
	return nil
}

// nodeLeaseSetting is the lease setting as both file formats write it.
type nodeLeaseSetting struct {
	Fraction float64 `yaml:"fraction"`
	TTL      string  `yaml:"ttl"`
}

// parse returns the setting in normalized form (nil for none).
func (s *nodeLeaseSetting) parse() (*NodeLease, error) {
	if s == nil {
		return nil, nil
	}
	if s.TTL == "" {
		return nil, fmt.Errorf("lease.ttl: missing")
	}
	ttl, err := parseDuration(s.TTL)
	if err != nil {
		return nil, fmt.Errorf("lease.ttl: %w", err)
	}
	return &NodeLease{Fraction: s.Fraction, TTL: ttl}, nil
}

func validateLimits(l bucket.Limits) error {
	if l.Capacity < 1 {
		return fmt.Errorf("capacity: must be > 0, got %d", l.Capacity)
	}
	if l.Capacity > MaxCapacity {
		return fmt.Errorf("capacity: %d is more than %d", l.Capacity, MaxCapacity)
	}
	if !(l.Overcommit >= 0 && l.Overcommit <= 1) {
		return fmt.Errorf("overcommit: %v must be in [0, 1]", l.Overcommit)
	}
	min, err := minIdleTTL(l)
	if err != nil {
		return err
	}
	if l.IdleTTL < min {
		return fmt.Errorf("idle_ttl: %v is shorter than %v (a full refill or window, at least %v)", l.IdleTTL, min, MinIdleTTL)
	}
	if l.IdleTTL > MaxWindow {
		return fmt.Errorf("idle_ttl: %v is longer than %v", l.IdleTTL, MaxWindow)
	}
	// The store's own validation last: whatever passes here, a check can use.
	if err := l.Validate(); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	return nil
}

// minIdleTTL is the shortest idle TTL l allows: a full refill (token bucket)
// or the window (two for the sliding window), rounded up to a whole second,
// and at least MinIdleTTL. It also validates the algorithm's own fields.
func minIdleTTL(l bucket.Limits) (time.Duration, error) {
	var need time.Duration
	switch l.Algorithm {
	case bucket.TokenBucket, "":
		r := l.RefillPerSecond
		if math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 {
			return 0, fmt.Errorf("refill: must be > 0 tokens per second, got %v", r)
		}
		secs := float64(l.Capacity) / r
		if secs > MaxWindow.Seconds() {
			return 0, fmt.Errorf("refill: a full refill takes %.0fs, more than %v", secs, MaxWindow)
		}
		need = time.Duration(math.Ceil(secs)) * time.Second
	case bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog:
		if l.Window < MinWindow || l.Window > MaxWindow {
			return 0, fmt.Errorf("window: %v must be between %v and %v", l.Window, MinWindow, MaxWindow)
		}
		need = l.Window
		if l.Algorithm == bucket.SlidingWindow {
			need = 2 * l.Window
		}
		need = (need + time.Second - 1).Truncate(time.Second)
	default:
		return 0, fmt.Errorf("algorithm: %q is not token_bucket, fixed_window, sliding_window or sliding_log", l.Algorithm)
	}
	if need < MinIdleTTL {
		need = MinIdleTTL
	}
	return need, nil
}

func validateShare(field string, v float64) error {
	if !(v >= 0 && v <= 1) {
		return fmt.Errorf("%s: %v must be in [0, 1]", field, v)
	}
	return nil
}

// validateName checks a policy name: [A-Za-z0-9_.-]{1,64}
// (etcdlayout.ValidName; policy names become etcd and Redis keys).
func validateName(name string) error {
	if !etcdlayout.ValidName(name) || len(name) > bucket.MaxPolicyNameLen {
		return fmt.Errorf("%q must be 1 to %d bytes of [A-Za-z0-9_.-]", name, min(etcdlayout.MaxNameLen, bucket.MaxPolicyNameLen))
	}
	return nil
}

// validateRegion checks a region name (etcdlayout.ValidName).
func validateRegion(region string) error {
	if !etcdlayout.ValidName(region) {
		return fmt.Errorf("region %q must be 1 to %d bytes of [A-Za-z0-9_.-]", region, etcdlayout.MaxNameLen)
	}
	return nil
}

// LoadStored parses stored policy documents (name → bytes) in name order
// and merges them; a document that does not parse, or that repeats a
// policy of an earlier one, is skipped and reported.
func LoadStored(docs map[string][]byte) (*Set, []error) {
	var errs []error
	set, _ := Merge()
	for _, n := range slices.Sorted(maps.Keys(docs)) {
		s, err := Parse(n, docs[n])
		if err != nil {
			errs = append(errs, fmt.Errorf("policy document %s: %w", n, err))
			continue
		}
		merged, err := Merge(set, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("policy document %s: %w", n, err))
			continue
		}
		set = merged
	}
	return set, slices.Clip(errs)
}
