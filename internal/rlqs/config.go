package rlqs

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
)

// Defaults for Config fields left zero.
const (
	DefaultInterval         = time.Second
	DefaultTTL              = 3 * time.Second
	DefaultMargin           = time.Second
	DefaultReserve          = 0.1
	DefaultIdleAfter        = 30 * time.Second
	DefaultMaxStreams       = 1024
	DefaultMaxBuckets       = 256
	DefaultMaxBucketIDBytes = 1024
)

// Bounds on Config.
const (
	// MaxBucketIDEntries is the most entries of one bucket id (Envoy's
	// descriptor depth bound).
	MaxBucketIDEntries = policy.MaxEntries
	// MaxConsumers is the most consumers one bucket is split among (the
	// allocator's bound).
	MaxConsumers = 256
	// MaxFillInterval is the longest fill_interval sent: a rate below one
	// token per MaxFillInterval is answered DENY_ALL.
	MaxFillInterval = time.Minute
	maxNodeLen      = 40
	// MaxTTL bounds Config.TTL: a lease lasts TTL + Margin, and a shrink
	// of the region's share waits for it.
	MaxTTL = time.Minute
	// DeadBand is the relative change of a bucket's rate below which its
	// assignment is kept (renewed) rather than changed.
	DeadBand = 0.2
)

// DemandSink receives demand records (regional.DemandSink; internal/demand
// implements it). Record must be cheap and safe for concurrent use.
type DemandSink interface {
	Record(policy, subject string, cost int64, admitted, pressured bool)
}

// ErrInvalidConfig reports a Config that New cannot use.
var ErrInvalidConfig = errors.New("rlqs: invalid config")

// Config configures a Server.
type Config struct {
	// Policies returns the node's current policy set; bucket ids are
	// matched against its Envoy domains as descriptors are. Required.
	Policies func() *policy.Set
	// Subjects turns descriptor values into bucket subjects, as for the
	// Envoy rate limit service (same salt, same plain keys).
	Subjects policy.EnvoySubjects
	// KeyOrder orders a bucket id's keys into a descriptor: the keys
	// listed here first, in this order, then the others sorted. A bucket
	// id is a map (Envoy gives no order); descriptors are ordered.
	KeyOrder []string
	// Share returns the share the region enforces for a policy and
	// subject (regionsync's Syncer.Share). Required.
	Share func(policy, subject string) float64
	// Request builds the bucket request of a policy and subject exactly
	// as the node's checks do (key version, share, Since, Withheld), so
	// that leases and Redis-backed checks share one bucket. Default: the
	// policy's key version and Share, clamped to [0, 1+ε].
	Request func(p *policy.Policy, subject bucket.Subject, now time.Time) (bucket.Request, error)
	// Demand, when set, receives what the Envoys report for each leased
	// bucket, as the node's own checks report theirs: the requests
	// allowed (admitted) and denied, the subject pressured when some were
	// denied, it holds no lease, or it used half its assignment's rate.
	// The coordinator then moves the region's share with the Envoys'
	// demand. An Envoy's counts are taken as reported: it is trusted with
	// them as with enforcing its assignments.
	Demand DemandSink
	// Part, when set, is this node's part of the region's bucket for a
	// policy and subject, in (0, 1]: the part of the leasable rate it
	// offers its Envoys (regional: the nodes' demand reports, as node
	// leases split). Default 1: every node offers its Envoys the whole
	// rate and the region's bucket grants first come, first served. Parts
	// guide what a node asks, not the bound: the bucket never leases more
	// than its refill in total.
	Part func(policy, subject string) float64
	// Store leases parts of the region's buckets. Required.
	Store bucket.Leaser
	// Node names this node in lease holders: [A-Za-z0-9_.-]{1,40}.
	Node string
	// Interval is how often assignments are re-split and sent. Default 1 s.
	Interval time.Duration
	// TTL is every assignment's time to live, whole seconds (the filter
	// truncates fractions), above Interval + Margin, so that a renewal
	// reaches the Envoy before the assignment expires. Default 3 s.
	TTL time.Duration
	// Margin bounds the time an assignment takes to reach an Envoy; a
	// lease ends TTL+Margin after it is sent, and a changed or revoked
	// one counts until Margin after. The bound rests on it. Default 1 s.
	Margin time.Duration
	// Reserve is the part of the region's refill never leased, in [0,
	// 0.9]: it refills the bucket for the bursts of changed assignments
	// and for Redis-backed checks of a leased subject. Default 0.1.
	Reserve float64
	// IdleAfter abandons a bucket (abandon_action) whose reports showed
	// no request for this long. Default 30 s.
	IdleAfter time.Duration
	// MaxStreams bounds the streams held; more are refused with
	// ResourceExhausted. Default 1024.
	MaxStreams int
	// MaxBuckets bounds the buckets of one stream; more get no assignment
	// (the filter's no-assignment behaviour applies). Default 256.
	MaxBuckets int
	// MaxBucketIDBytes bounds the bytes of one bucket id's keys and
	// values; a larger one closes the stream with InvalidArgument.
	// Default 1024.
	MaxBucketIDBytes int
	// Clock times leases and demand. Default clock.Real{}.
	Clock clock.Clock
	// Logger defaults to hclog.NewNullLogger().
	Logger hclog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	if c.Policies == nil || c.Share == nil || c.Store == nil {
		return c, fmt.Errorf("%w: Policies, Share and Store are required", ErrInvalidConfig)
	}
	if c.Node == "" {
		c.Node = "node"
	}
	if len(c.Node) > maxNodeLen {
		return c, fmt.Errorf("%w: node %q longer than %d bytes", ErrInvalidConfig, c.Node, maxNodeLen)
	}
	for i := 0; i < len(c.Node); i++ {
		if b := c.Node[i]; !(b == '.' || b == '_' || b == '-' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z') {
			return c, fmt.Errorf("%w: node %q: byte %q outside [A-Za-z0-9_.-]", ErrInvalidConfig, c.Node, b)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Interval, DefaultInterval)
	def(&c.TTL, DefaultTTL)
	def(&c.Margin, DefaultMargin)
	def(&c.IdleAfter, DefaultIdleAfter)
	if c.Reserve == 0 {
		c.Reserve = DefaultReserve
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxBuckets == 0 {
		c.MaxBuckets = DefaultMaxBuckets
	}
	if c.MaxBucketIDBytes == 0 {
		c.MaxBucketIDBytes = DefaultMaxBucketIDBytes
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Request == nil {
		share := c.Share
		c.Request = func(p *policy.Policy, subject bucket.Subject, _ time.Time) (bucket.Request, error) {
			k, err := bucket.NewSubjectKey(p.Name, p.KeyVersion(), subject)
			f := share(p.Name, subject.String())
			if math.IsNaN(f) || f < 0 {
				f = 0
			}
			return bucket.Request{Key: k, Limits: p.Limits, Share: min(f, 1+p.Limits.Overcommit)}, err
		}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	switch {
	case c.Interval < 10*time.Millisecond:
		return c, fmt.Errorf("%w: interval %v below 10ms", ErrInvalidConfig, c.Interval)
	case c.TTL < time.Second || c.TTL%time.Second != 0 || c.TTL <= c.Interval+c.Margin:
		return c, fmt.Errorf("%w: TTL %v: want whole seconds, above the interval plus the margin (%v), so that a renewal arrives before the assignment expires", ErrInvalidConfig, c.TTL, c.Interval+c.Margin)
	case c.TTL > MaxTTL:
		return c, fmt.Errorf("%w: TTL %v above %v", ErrInvalidConfig, c.TTL, MaxTTL)
	case c.Margin < 0 || c.Margin > MaxTTL:
		return c, fmt.Errorf("%w: margin %v outside 0..%v", ErrInvalidConfig, c.Margin, MaxTTL)
	case math.IsNaN(c.Reserve) || c.Reserve < 0 || c.Reserve > 0.9:
		return c, fmt.Errorf("%w: reserve %v outside [0, 0.9]", ErrInvalidConfig, c.Reserve)
	case c.IdleAfter < c.Interval:
		return c, fmt.Errorf("%w: idle-after %v below the interval", ErrInvalidConfig, c.IdleAfter)
	case c.MaxStreams < 1 || c.MaxBuckets < 1 || c.MaxBucketIDBytes < 1:
		return c, fmt.Errorf("%w: bounds must be positive", ErrInvalidConfig)
	}
	if err := c.Subjects.Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return c, nil
}
