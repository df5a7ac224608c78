package rebalance

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/plan"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Protocol says how a change of shares is published (plan.Protocol).
type Protocol = plan.Protocol

const (
	// ProtocolTwoStep shrinks first and grows after acknowledgements.
	ProtocolTwoStep = plan.TwoStep
	// ProtocolNaive publishes new shares at once. It can let shares sum
	// above 1 + ε while regions apply them; it exists for comparison.
	ProtocolNaive = plan.Naive
)

// Sentinel errors.
var (
	// ErrConfig wraps every configuration error.
	ErrConfig = errors.New("rebalance: invalid config")
	// ErrNotLeader says this coordinator does not lead (or lost the lead
	// while writing).
	ErrNotLeader = errors.New("rebalance: not the leader")
	// ErrUnknownPolicy says no stored document defines the policy.
	ErrUnknownPolicy = errors.New("rebalance: unknown policy")
	// ErrTooManyRegistrations says a round read more registrations than
	// MaxNodes, MaxNodesPerRegion or MaxRegions allow: it publishes
	// nothing (fake registrations cannot be told from real ones, and
	// ignoring real ones would give their shares away).
	ErrTooManyRegistrations = errors.New("rebalance: too many registrations")
)

// Bounds on what input can grow.
const (
	// MaxNodes is the most registered nodes (over all regions) a round
	// accepts; a round that reads more fails without publishing.
	MaxNodes = 4096
	// MaxNodesPerRegion is the most registered nodes of one region a
	// round accepts; a round that reads more fails without publishing.
	MaxNodesPerRegion = 256
	// MaxOverridesLimit is the largest accepted Config.MaxOverrides.
	MaxOverridesLimit = plan.MaxOverridesLimit
)

// Config configures a Loop. Zero fields take the defaults listed.
type Config struct {
	// Client talks to etcd. Required.
	Client *clientv3.Client
	// Prefix is the etcd key prefix everything lives under; default
	// "/quota/v1/".
	Prefix string
	// Name is this coordinator's identity in the election, conventionally
	// its operator address. Default "coordinator".
	Name string
	// Clock reads the time for skew margins and timestamps. Default the
	// system's clock.
	Clock Clock
	// Interval between rounds. Default 5s.
	Interval time.Duration
	// ReportInterval is published in Settings for the regions. Default
	// Interval.
	ReportInterval time.Duration
	// RegionLeaseTTL is published in Settings for the regions. Default 10s.
	RegionLeaseTTL time.Duration
	// AckDeadline is published in Settings: a node whose watch of the
	// allocations is silent that long falls back to its safe shares, and
	// a growth waits no longer than that (plus SkewMargin) for a node's
	// acknowledgement (plan.Params.AckDeadline). Default 3 RegionLeaseTTL.
	AckDeadline time.Duration
	// SkewMargin is how long after a region's registration vanished the
	// leader still counts it at its old shares. Default 2s.
	SkewMargin time.Duration
	// SessionTTL is the TTL of the leader's election session. Default 5s.
	SessionTTL time.Duration
	// Algorithm, MaxStep and DeadBand go to allocator.Params. Algorithm
	// defaults to MaxMinFair and DeadBand to 0.01; MaxStep 0 means no step
	// limit, as in allocator.Params (cmd/coordinator's flag defaults to
	// 0.3).
	Algorithm allocator.Algorithm
	MaxStep   float64
	DeadBand  float64
	// Alpha is the demand smoothing factor in (0, 1]. Default 0.5.
	Alpha float64
	// Protocol defaults to ProtocolTwoStep.
	Protocol Protocol
	// MaxOverrides bounds the subject overrides per policy. Default 64.
	MaxOverrides int
	// OverrideRounds is how many rounds a subject keeps its override after
	// the last report of pressure. Default 3.
	OverrideRounds int
	// FullEvery is how often a full round plans every policy: every
	// FullEvery-th full round does, the others plan only the policies
	// whose demand, acknowledgements, controls, definition or allocation
	// changed since the last full round, those the planner is not done
	// with (smoothed demand still moving, a shrink pending, a live region
	// without a share), and every policy for a skew margin plus an
	// Interval after registrations change. Default 10; 1 plans every
	// policy every round.
	FullEvery int
	// Logger defaults to hclog.NewNullLogger().
	Logger hclog.Logger
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

// withDefaults returns c with zero fields defaulted, or an error.
func (c Config) withDefaults() (Config, error) {
	if c.Client == nil {
		return c, fmt.Errorf("%w: Client is required", ErrConfig)
	}
	if c.Name == "" {
		c.Name = "coordinator"
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	def := func(d *time.Duration, v time.Duration, name string) error {
		if *d < 0 {
			return fmt.Errorf("%w: %s %v is negative", ErrConfig, name, *d)
		}
		if *d == 0 {
			*d = v
		}
		return nil
	}
	for _, f := range []struct {
		d    *time.Duration
		v    time.Duration
		name string
	}{
		{&c.Interval, 5 * time.Second, "Interval"},
		{&c.ReportInterval, c.Interval, "ReportInterval"},
		{&c.RegionLeaseTTL, 10 * time.Second, "RegionLeaseTTL"},
		{&c.AckDeadline, 3 * max(c.RegionLeaseTTL, 10*time.Second), "AckDeadline"},
		{&c.SkewMargin, 2 * time.Second, "SkewMargin"},
		{&c.SessionTTL, 5 * time.Second, "SessionTTL"},
	} {
		if err := def(f.d, f.v, f.name); err != nil {
			return c, err
		}
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = c.Interval
	}
	if c.Algorithm == "" {
		c.Algorithm = allocator.MaxMinFair
	}
	if c.DeadBand == 0 {
		c.DeadBand = 0.01
	}
	if c.Alpha == 0 {
		c.Alpha = 0.5
	}
	if math.IsNaN(c.Alpha) || c.Alpha <= 0 || c.Alpha > 1 {
		return c, fmt.Errorf("%w: Alpha %v must be in (0, 1]", ErrConfig, c.Alpha)
	}
	if err := (allocator.Params{Algorithm: c.Algorithm, MaxStep: c.MaxStep, DeadBand: c.DeadBand}).Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	switch c.Protocol {
	case "":
		c.Protocol = ProtocolTwoStep
	case ProtocolTwoStep, ProtocolNaive:
	default:
		return c, fmt.Errorf("%w: protocol %q is not %q or %q", ErrConfig, c.Protocol, ProtocolTwoStep, ProtocolNaive)
	}
	if c.MaxOverrides == 0 {
		c.MaxOverrides = 64
	}
	if c.MaxOverrides < 0 || c.MaxOverrides > MaxOverridesLimit {
		return c, fmt.Errorf("%w: MaxOverrides %d not in [0, %d]", ErrConfig, c.MaxOverrides, MaxOverridesLimit)
	}
	switch {
	case c.FullEvery < 0:
		return c, fmt.Errorf("%w: FullEvery %d is negative", ErrConfig, c.FullEvery)
	case c.FullEvery == 0:
		c.FullEvery = 10
	}
	if c.OverrideRounds <= 0 {
		c.OverrideRounds = 3
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if err := c.params().Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, nil
}

// params are the planner's rules of a defaulted Config.
func (c *Config) params() plan.Params {
	return plan.Params{
		Algorithm:      c.Algorithm,
		MaxStep:        c.MaxStep,
		DeadBand:       c.DeadBand,
		Alpha:          c.Alpha,
		Protocol:       c.Protocol,
		MaxOverrides:   c.MaxOverrides,
		OverrideRounds: c.OverrideRounds,
		SkewMargin:     c.SkewMargin,
		AckDeadline:    c.AckDeadline,
	}
}

// Clock tells a Loop the time; tests pass a manual one.
type Clock interface {
	Now() time.Time
}

// systemClock is the system's clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
