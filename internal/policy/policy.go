package policy

import (
	"github.com/quotacoord/quota/bucket"
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

// Policy is one validated policy in normalized form, whichever file format
// it came from.
type Policy struct {
	// Name is unique within a Set, [A-Za-z0-9_.-]{1,64}.
	Name string
	// Version is part of every bucket key: raising it starts fresh buckets.
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
}

// MinShareFor returns region's guaranteed minimum share.
func (p *Policy) MinShareFor(region string) float64 {
	if m, ok := p.MinShare[region]; ok {
		return m
	}
	return p.DefaultMinShare
}
